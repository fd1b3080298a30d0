package protocol

import (
	"regexp"
	"strings"
	"testing"
)

// tokenRE is the definition of a valid id that ValidToken's loop replaced:
// the test holds the loop to it.
var tokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

func TestValidTokenMatchesDefinition(t *testing.T) {
	cases := []string{
		"", "a", "A", "0", "_", "-", "job-1", "pool_a", "agent-01",
		strings.Repeat("x", MaxTokenLen), strings.Repeat("x", MaxTokenLen+1),
		"a.b", "a b", "a*", "a>", "a\n", "\na", "é", "a\x00", "ab/c", "a=b", "a:b",
	}
	for _, c := range cases {
		if got, want := ValidToken(c), tokenRE.MatchString(c); got != want {
			t.Errorf("ValidToken(%q) = %v, the definition says %v", c, got, want)
		}
	}
}

func FuzzValidToken(f *testing.F) {
	for _, s := range []string{"", "job-1", "a.b", strings.Repeat("z", 129), "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidToken(s), tokenRE.MatchString(s); got != want {
			t.Errorf("ValidToken(%q) = %v, the definition says %v", s, got, want)
		}
	})
}

func BenchmarkValidToken(b *testing.B) {
	for b.Loop() {
		if !ValidToken("job-0123456789abcdef") {
			b.Fatal("valid id refused")
		}
	}
}

func TestValidReplySubject(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{
		"_INBOX.abc":                      true,
		"_INBOX.publisher.abc.1":          true,
		"_INBOX.a*b":                      true, // not a wildcard token
		"_INBOX.":                         false,
		"_INBOX":                          false,
		"$KV.warden_jobs.job.x":           false,
		"warden.task.0.default.a":         false,
		"$JS.API.STREAM.PURGE.WARDEN_DLQ": false,
		"_INBOX.a..b":                     false,
		"_INBOX.a.":                       false,
		"_INBOX.*":                        false,
		"_INBOX.a.>":                      false,
		"_INBOX.a b":                      false,
		"_INBOX.a\tb":                     false,
		"x_INBOX.a":                       false,
		"_inbox.a":                        false,
	} {
		if got := ValidReplySubject(s); got != want {
			t.Errorf("ValidReplySubject(%q) = %v, want %v", s, got, want)
		}
	}
}

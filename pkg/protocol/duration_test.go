package protocol_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/wardenhq/warden/pkg/protocol"
)

func TestDurationJSON(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{0, time.Nanosecond, 1500 * time.Microsecond, 90 * time.Second, 26*time.Hour + 3*time.Millisecond} {
		got, err := json.Marshal(protocol.Duration(d))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(d.String())
		if string(got) != string(want) {
			t.Errorf("%s encodes as %s, want %s", d, got, want)
		}
		var back protocol.Duration
		if err := json.Unmarshal(got, &back); err != nil || back.Std() != d {
			t.Errorf("%s: decoded %s back as %s, %v", d, got, back, err)
		}
	}
	for in, want := range map[string]time.Duration{
		`"30s"`:               30 * time.Second,
		`"\u0033\u0030s"`:     30 * time.Second, // escapes: the long way
		`"1m\u00b5s"`:         0,                // "1mµs" is not a duration
		`""`:                  0,
		`5000000000`:          5 * time.Second,
		`{"timeout":"250ms"}`: 250 * time.Millisecond,
	} {
		var d protocol.Duration
		var err error
		if in[0] == '{' {
			var v struct {
				Timeout protocol.Duration `json:"timeout"`
			}
			err = json.Unmarshal([]byte(in), &v)
			d = v.Timeout
		} else {
			err = json.Unmarshal([]byte(in), &d)
		}
		if in == `"1m\u00b5s"` {
			if err == nil {
				t.Errorf("%s decoded as %s, want an error", in, d)
			}
			continue
		}
		if err != nil || d.Std() != want {
			t.Errorf("%s decoded as %s, %v; want %s", in, d, err, want)
		}
	}
	for _, in := range []string{`"-1s"`, `"soon"`, `true`} {
		var d protocol.Duration
		if err := json.Unmarshal([]byte(in), &d); err == nil {
			t.Errorf("%s decoded as %s, want an error", in, d)
		}
	}
}

// A JSON number is nanoseconds: a negative one is refused, as "-1s" is.
func TestDurationJSONRejectsNegativeNumber(t *testing.T) {
	t.Parallel()
	for _, in := range []string{`-1`, `-3600000000000`, `{"timeout":-5000000000}`} {
		var v struct {
			Timeout protocol.Duration `json:"timeout"`
		}
		var err error
		if in[0] == '{' {
			err = json.Unmarshal([]byte(in), &v)
		} else {
			err = json.Unmarshal([]byte(in), &v.Timeout)
		}
		if err == nil || !strings.Contains(err.Error(), "negative") {
			t.Errorf("%s decoded as %s, %v; want an error saying negative", in, v.Timeout, err)
		}
	}
	var d protocol.Duration
	if err := json.Unmarshal([]byte(`0`), &d); err != nil || d != 0 {
		t.Errorf("0 decoded as %s, %v", d, err)
	}
}

// SignedDuration is for the settings where a negative value means
// something (retention: -1s, anchor_interval: -1s): it decodes and encodes
// negative values in JSON and YAML, which Duration refuses.
func TestSignedDurationTakesNegativeValues(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		`"-1s"`: -time.Second, `-1000`: -time.Microsecond, `"90s"`: 90 * time.Second, `""`: 0,
	} {
		var d protocol.SignedDuration
		if err := json.Unmarshal([]byte(in), &d); err != nil || d.Std() != want {
			t.Errorf("JSON %s decoded as %s, %v; want %s", in, d, err, want)
		}
	}
	var v struct {
		Retention protocol.SignedDuration `yaml:"retention"`
	}
	if err := yaml.Unmarshal([]byte("retention: -1s\n"), &v); err != nil || v.Retention.Std() != -time.Second {
		t.Fatalf("YAML -1s decoded as %s, %v", v.Retention, err)
	}
	out, err := yaml.Marshal(v)
	if err != nil || string(out) != "retention: -1s\n" {
		t.Fatalf("YAML encoding: %q, %v", out, err)
	}
	if b, err := json.Marshal(protocol.SignedDuration(-time.Second)); err != nil || string(b) != `"-1s"` {
		t.Fatalf("JSON encoding: %s, %v", b, err)
	}
	for _, in := range []string{"retention: soon\n", "retention: [1]\n"} {
		if err := yaml.Unmarshal([]byte(in), &v); err == nil {
			t.Errorf("YAML %q decoded as %s, want an error", in, v.Retention)
		}
	}
	var d protocol.Duration
	if err := yaml.Unmarshal([]byte("-1s"), &d); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Fatalf("Duration took -1s from YAML: %s, %v", d, err)
	}
}

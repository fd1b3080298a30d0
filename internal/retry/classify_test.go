package retry_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/config"
	"github.com/wardenhq/warden/internal/retry"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
)

// TestRetriable checks the built-in rules alone, with the unclassified
// default both ways.
func TestRetriable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		class, msg string
		def, want  bool
	}{
		{protocol.ClassRetriable, "invalid params", false, true},
		{protocol.ClassPermanent, "connection refused", true, false},
		{"", "dial tcp: connection refused", false, true},
		{"", "read: connection reset by peer", false, true},
		{"", "context deadline exceeded", false, true},
		{"", "service unavailable (503)", false, true},
		{"", "invalid parameter: timeout must be positive", true, false},
		{"", "open /etc/x: permission denied", true, false},
		{"", "unknown action \"x\"", true, false},
		{"", "exit status 3", false, false},
		{"", "exit status 3", true, true},
	}
	for _, c := range cases {
		if got := retry.Classify(c.class, c.msg, 0, retry.Classification{RetryUnclassified: c.def}).Retriable; got != c.want {
			t.Errorf("Classify(%q, %q, unclassified retriable %v).Retriable = %v, want %v", c.class, c.msg, c.def, got, c.want)
		}
	}
}

// classOf reads an error the way pkg/agent reports it.
func classOf(err error) (string, time.Duration) {
	var c interface{ ErrorClass() string }
	var r interface{ RetryAfter() time.Duration }
	class, after := "", time.Duration(0)
	if errors.As(err, &c) {
		class = c.ErrorClass()
	}
	if errors.As(err, &r) {
		after = r.RetryAfter()
	}
	return class, after
}

func TestClassify(t *testing.T) {
	t.Parallel()
	def := retry.DefaultClassification()
	cases := []struct {
		name      string
		err       error
		class     string // the agent's class when err is nil
		after     time.Duration
		msg       string
		retriable bool
		wantClass string
		wantAfter time.Duration
	}{
		// Typed errors of the Go SDK.
		{name: "sdk permanent", err: agent.Permanent(errors.New("connection refused")), retriable: false, wantClass: "permanent"},
		{name: "sdk retriable", err: agent.Retriable(errors.New("invalid input")), retriable: true, wantClass: "retriable"},
		{name: "sdk retry after", err: agent.RetryAfter(30*time.Second, errors.New("busy")), retriable: true, wantClass: "retriable", wantAfter: 30 * time.Second},
		{name: "sdk retry after capped", err: agent.RetryAfter(5*time.Hour, errors.New("busy")), retriable: true, wantClass: "retriable", wantAfter: time.Hour},
		{name: "sdk wrapped", err: fmt.Errorf("step x: %w", agent.Permanent(errors.New("boom"))), retriable: false, wantClass: "permanent"},
		// Classes other agents put in the result payload.
		{name: "payload transient", class: "Transient", msg: "whatever", retriable: true, wantClass: "retriable"},
		{name: "payload fatal", class: "fatal", msg: "timeout", retriable: false, wantClass: "permanent"},
		{name: "payload non-retryable", class: "non-retryable", msg: "timeout", retriable: false, wantClass: "permanent"},
		{name: "payload retry_after only", msg: "slow down", after: 2 * time.Second, retriable: true, wantClass: "retriable", wantAfter: 2 * time.Second},
		{name: "payload permanent ignores after", class: "permanent", after: time.Second, msg: "x", retriable: false, wantClass: "permanent"},
		{name: "unknown class falls back to text", class: "weird", msg: "i/o timeout", retriable: true, wantClass: "timeout"},
		// Untyped errors, by text.
		{name: "timeout", msg: "dial tcp 10.0.0.1:443: i/o timeout", retriable: true, wantClass: "timeout"},
		{name: "timed out", msg: "shell: command timed out after 50ms", retriable: true, wantClass: "timeout"},
		{name: "deadline", msg: "context deadline exceeded", retriable: true, wantClass: "timeout"},
		{name: "step deadline", msg: "step deadline reached: step timeout 30s", retriable: true, wantClass: "timeout"},
		// The texts pkg/agent's runHandler builds around agent.ErrDeadline.
		{name: "sdk deadline", err: agent.ErrDeadline, retriable: true, wantClass: "timeout"},
		{name: "sdk deadline before start", err: fmt.Errorf("%w: passed before the handler could start", agent.ErrDeadline), retriable: true, wantClass: "timeout"},
		{name: "sdk deadline abandoned", err: fmt.Errorf("handler did not return after cancellation: %w", agent.ErrDeadline), retriable: true, wantClass: "timeout"},
		{name: "sdk deadline wraps the handler's error", err: fmt.Errorf("%w: %w", agent.ErrDeadline, errors.New("query users: invalid connection")), retriable: true, wantClass: "timeout"},
		{name: "sdk deadline of a typed error", err: fmt.Errorf("%w: %w", agent.ErrDeadline, agent.Permanent(errors.New("bad input"))), retriable: false, wantClass: "permanent"},
		// URLs and addresses name where a request went, not what went wrong.
		{name: "validation in a quoted url", msg: `Post "https://x/api/validation": dial tcp 10.0.0.1:443: connect: connection refused`, retriable: true, wantClass: "connection"},
		{name: "invalid in a url path", msg: `Get "https://api.example.com/v1/invalid-items?id=3": read tcp 10.0.0.1:51234->10.0.0.2:443: read: connection reset by peer`, retriable: true, wantClass: "connection"},
		{name: "invalid in a url host", msg: `Get "https://invalid.example.com/": net/http: request canceled (Client.Timeout exceeded while awaiting headers)`, retriable: true, wantClass: "timeout"},
		{name: "invalid in an unquoted url", msg: "http: GET http://x/items/invalid: status 503, expected 200", retriable: true, wantClass: "unavailable"},
		{name: "validation in an ipv6 url", msg: `Post "http://[fd00::1]:8080/validation": dial tcp [fd00::1]:8080: connect: connection refused`, retriable: true, wantClass: "connection"},
		{name: "invalid in a host:port", msg: "dial tcp invalid-db.example.com:5432: connect: connection refused", retriable: true, wantClass: "connection"},
		{name: "invalid in a looked-up host", msg: "dial tcp: lookup invalid.example.com on 10.0.0.2:53: read udp 10.0.0.1:40000->10.0.0.2:53: i/o timeout", retriable: true, wantClass: "timeout"},
		{name: "text after a url still counts", msg: `Post "https://x/api": validation failed: name too long`, retriable: false, wantClass: "validation"},
		{name: "dotted exception names are not hosts", msg: "java.util.concurrent.TimeoutException: after 30000 ms", retriable: true, wantClass: "timeout"},
		// A certificate is renewed by an operator, not by a backoff.
		{name: "expired certificate", msg: `Get "https://x/": tls: failed to verify certificate: x509: certificate has expired or is not yet valid: current time 2026-01-02T03:04:05Z is after 2025-12-31T00:00:00Z`, retriable: false, wantClass: "certificate"},
		{name: "refused", msg: "dial tcp [::1]:5432: connect: Connection Refused", retriable: true, wantClass: "connection"},
		{name: "reset", msg: "read tcp: connection reset by peer", retriable: true, wantClass: "connection"},
		{name: "unavailable", msg: "rpc error: code = Unavailable", retriable: true, wantClass: "unavailable"},
		{name: "http 503", msg: "http: GET http://x/: status 503, expected 200", retriable: true, wantClass: "unavailable"},
		{name: "http 429", msg: "http: GET http://x/: status 429, expected 200", retriable: true, wantClass: "throttled"},
		{name: "temporary", msg: "temporary failure in name resolution", retriable: true, wantClass: "temporary"},
		{name: "eagain", msg: "fork: resource temporarily unavailable", retriable: true, wantClass: "unavailable"},
		{name: "stale heartbeat", msg: "agent a1: stale heartbeat (12s)", retriable: true, wantClass: "stale_heartbeat"},
		{name: "queue expiry", msg: "task expired in queue after 1h", retriable: true, wantClass: "expired"},
		{name: "lease lost", msg: "task lease lost: the server did not confirm an extension in time", retriable: true, wantClass: "lease_lost"},
		{name: "validation", msg: "validation failed: name too long", retriable: false, wantClass: "validation"},
		{name: "permission", msg: "open /etc/shadow: permission denied", retriable: false, wantClass: "permission_denied"},
		{name: "forbidden", msg: "403 Forbidden", retriable: false, wantClass: "permission_denied"},
		{name: "not found", msg: "exec: \"foo\": executable file not found in $PATH", retriable: false, wantClass: "not_found"},
		{name: "invalid params", msg: "invalid params: field \"duration\" is required", retriable: false, wantClass: "invalid_params"},
		{name: "permanent beats retriable", msg: "invalid parameter: timeout must be positive", retriable: false, wantClass: "invalid_params"},
		{name: "unknown action", msg: "unknown action \"x\" (this agent allows: echo)", retriable: false, wantClass: "unknown_action"},
		{name: "unclassified", msg: "shell: make exited with code 2", retriable: false, wantClass: "unclassified"},
		// A reviewer's cases. Old code: retried every "expired" (an
		// operator renews a token or a password), and did not retry
		// these transient failures; "lookup" ate the word after it.
		{name: "expired token", msg: "ExpiredToken: The security token included in the request is expired", retriable: false, wantClass: "unclassified"},
		{name: "expired password", msg: "password expired", retriable: false, wantClass: "unclassified"},
		{name: "agent's queue expiry", msg: "expired: not started by 2026-11-28T10:00:00Z", retriable: true, wantClass: "expired"},
		{name: "http eof", msg: `http: GET https://api.example.com/v1: EOF`, retriable: true, wantClass: "connection"},
		{name: "body eof", msg: "http: read body: unexpected EOF", retriable: true, wantClass: "connection"},
		{name: "no route", msg: "dial tcp 10.0.0.7:443: connect: no route to host", retriable: true, wantClass: "connection"},
		{name: "unreachable", msg: "dial tcp 10.0.0.7:443: connect: network is unreachable", retriable: true, wantClass: "connection"},
		{name: "http 500", msg: "http: GET https://x/: status 500, expected 200", retriable: true, wantClass: "unavailable"},
		{name: "lookup as a word", msg: "service lookup timed out", retriable: true, wantClass: "timeout"},
		{name: "geofence is no eof", msg: "geofence rejected", retriable: false, wantClass: "unclassified"},
		{name: "empty", msg: "", retriable: false, wantClass: "unclassified"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			class, after, msg := c.class, c.after, c.msg
			if c.err != nil {
				class, after = classOf(c.err)
				msg = c.err.Error()
			}
			d := retry.Classify(class, msg, after, def)
			if d.Retriable != c.retriable || d.Class != c.wantClass || d.After != c.wantAfter {
				t.Fatalf("Classify(%q, %q, %s) = %+v, want retriable=%v class=%s after=%s",
					class, msg, after, d, c.retriable, c.wantClass, c.wantAfter)
			}
		})
	}
}

func TestClassifyConfig(t *testing.T) {
	t.Parallel()
	cfg := retry.DefaultClassification()
	cfg.RetryUnclassified = true
	cfg.Rules = []retry.Rule{
		{Match: "Quota Exceeded", Class: "quota", Retriable: true},
		{Match: "not found in cache", Class: "cache_miss", Retriable: true},
		{Match: "payments.example.com", Class: "payments", Retriable: true},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		msg       string
		retriable bool
		class     string
	}{
		{"quota exceeded for project p", true, "quota"},
		{"key k not found in cache", true, "cache_miss"}, // custom rules come before built-in ones
		{"key k not found", false, "not_found"},
		// The operator's rules see the whole text, URLs included.
		{`Post "https://payments.example.com/charge": EOF`, true, "payments"},
		{"exit status 3", true, "unclassified"},
	}
	for _, c := range cases {
		if d := retry.Classify("", c.msg, 0, cfg); d.Retriable != c.retriable || d.Class != c.class {
			t.Errorf("Classify(%q) = %+v, want %v %s", c.msg, d, c.retriable, c.class)
		}
	}
	bad := cfg
	bad.Rules = []retry.Rule{{Match: " ", Class: "x"}}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "classification.rules[0].match") {
		t.Errorf("empty match: %v", err)
	}
	bad.Rules = []retry.Rule{{Match: "x"}}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "classification.rules[0].class") {
		t.Errorf("empty class: %v", err)
	}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	cfg := retry.DefaultConfig()
	half := func() float64 { return 0.5 }
	d, delay, ok := cfg.Decide("echo", nil, 1, "", "connection refused", 0, half)
	if !ok || d.Class != "connection" || delay != 2*time.Second {
		t.Errorf("second retry of a connection failure: %+v %s %v", d, delay, ok)
	}
	zero := 0
	if _, _, ok := cfg.Decide("echo", &retry.Override{MaxRetries: &zero}, 0, "", "timeout", 0, half); ok {
		t.Error("step with max_retries 0 retried")
	}
	if _, _, ok := cfg.Decide("echo", nil, 0, "", "permission denied", 0, half); ok {
		t.Error("permanent failure retried")
	}
}

// TestConfigFile checks that configs/retry.yaml writes out exactly the
// defaults.
func TestConfigFile(t *testing.T) {
	t.Parallel()
	var got retry.Config
	if err := config.Load("../../configs/retry.yaml", &got); err != nil {
		t.Fatal(err)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
	want := retry.DefaultConfig()
	if fmt.Sprintf("%+v", got.Policies.Default) != fmt.Sprintf("%+v", want.Policies.Default) ||
		len(got.ByAction) != 0 || got.Classification.RetryUnclassified != want.Classification.RetryUnclassified ||
		got.Classification.MaxRetryAfter != want.Classification.MaxRetryAfter || len(got.Classification.Rules) != 0 {
		t.Fatalf("configs/retry.yaml = %+v, want the defaults %+v", got, want)
	}
	// Decoding onto the defaults keeps what a file leaves out.
	partial := retry.DefaultConfig()
	if err := config.Decode([]byte("default: {max_retries: 0}\nactions: {http: {jitter: 0}}\n"), &partial); err != nil {
		t.Fatal(err)
	}
	if p := partial.Resolve("http", nil); p.MaxRetries != 0 || p.Jitter != 0 || p.BaseBackoff != protocol.Duration(time.Second) {
		t.Fatalf("partial file: %+v", p)
	}
}

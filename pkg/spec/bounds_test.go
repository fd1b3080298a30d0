package spec_test

import (
	"testing"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// Every duration of a spec is bounded like delay and ttl (a year, 8784h):
// a larger one overflows the scheduler's sums (a timeout plus the dispatch
// grace), and 2562047h47m is a valid Go duration.
func TestParseBoundsDurations(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, in, reason, mention string
	}{
		{"timeout overflowing", "name: x\nsteps: [{id: a, action: echo, timeout: 2562047h47m}]", spec.ReasonInvalidValue, "steps[0].timeout"},
		{"timeout over a year", "name: x\nsteps: [{id: a, action: echo, timeout: 8785h}]", spec.ReasonInvalidValue, "at most 8784h"},
		{"expires_in as ttl", "name: x\nsteps: [{id: a, action: echo, expires_in: 9000h}]", spec.ReasonInvalidValue, "steps[0].expires_in"},
		{"retry max_backoff", "name: x\nsteps: [{id: a, action: echo, retry: {max_backoff: 9000h}}]", spec.ReasonInvalidValue, "steps[0].retry.max_backoff"},
		{"retry base_backoff", "name: x\nsteps: [{id: a, action: echo, retry: {base_backoff: 9000h, max_backoff: 9000h}}]", spec.ReasonInvalidValue, "steps[0].retry.base_backoff"},
		{"compensation timeout", "name: x\nsteps: [{id: a, action: echo, compensate: {action: undo, timeout: 9000h}}]", spec.ReasonInvalidValue, "steps[0].compensate.timeout"},
		{"compensation retry", "name: x\nsteps: [{id: a, action: echo, compensate: {action: undo, retry: {max_backoff: 9000h}}}]", spec.ReasonInvalidValue, "steps[0].compensate.retry.max_backoff"},
		// A JSON number is nanoseconds; negative, it is refused as "-1h" is.
		{"negative JSON number", `{"name":"x","steps":[{"id":"a","action":"echo","timeout":-3600000000000}]}`, spec.ReasonMalformed, "negative"},
		{"negative JSON number delay", `{"name":"x","delay":-1,"steps":[{"id":"a","action":"echo"}]}`, spec.ReasonMalformed, "negative"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := spec.Parse([]byte(c.in), spec.Limits{})
			checkRejected(t, err, c.reason, c.mention)
		})
	}
	for _, in := range []string{
		"name: x\nsteps: [{id: a, action: echo, timeout: 8784h, expires_in: 8784h, retry: {base_backoff: 1h, max_backoff: 8784h}}]",
		`{"name":"x","steps":[{"id":"a","action":"echo","timeout":3600000000000}]}`,
	} {
		if _, err := spec.Parse([]byte(in), spec.Limits{}); err != nil {
			t.Errorf("%s: %v", in, err)
		}
	}
	// A spec built in Go skips decoding: Validate refuses a negative
	// duration itself.
	j := spec.Job{Name: "x", Steps: []spec.Step{{ID: "a", Action: "echo", Timeout: protocol.Duration(-time.Second)}}}
	checkRejected(t, j.Validate(spec.Limits{}), spec.ReasonInvalidValue, "steps[0].timeout", "negative")
}

// maxDelay bounds run_at as it bounds delay: at most a year ahead.
func TestParseBoundsRunAt(t *testing.T) {
	t.Parallel()
	at := func(d time.Duration) string {
		return "name: x\nrun_at: " + time.Now().Add(d).UTC().Format(time.RFC3339) + "\nsteps: [{id: a, action: echo}]"
	}
	_, err := spec.Parse([]byte(at(367*24*time.Hour)), spec.Limits{})
	checkRejected(t, err, spec.ReasonInvalidValue, "run_at", "ahead")
	_, err = spec.Parse([]byte("name: x\nrun_at: 9999-12-31T23:59:59Z\nsteps: [{id: a, action: echo}]"), spec.Limits{})
	checkRejected(t, err, spec.ReasonInvalidValue, "run_at")
	// Within the year, or past (a delayed job parsed again when released).
	for _, in := range []string{at(365 * 24 * time.Hour), at(-time.Hour), "name: x\nrun_at: 2001-01-01T00:00:00Z\nsteps: [{id: a, action: echo}]"} {
		if _, err := spec.Parse([]byte(in), spec.Limits{}); err != nil {
			t.Errorf("%s: %v", in, err)
		}
	}
}

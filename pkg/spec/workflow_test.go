package spec_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/pkg/spec"
)

func TestWorkflowFieldsRejected(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, in, reason, mention string
	}{
		{"bad priority", "name: x\npriority: urgent\nsteps: [{id: a, action: echo}]", spec.ReasonInvalidValue, "urgent"},
		{"bad step priority", "name: x\nsteps: [{id: a, action: echo, priority: HIGH}]", spec.ReasonInvalidValue, "steps[0].priority"},
		{"run_at and delay", "name: x\nrun_at: 2030-01-01T00:00:00Z\ndelay: 2s\nsteps: [{id: a, action: echo}]", spec.ReasonInvalidValue, "not both"},
		{"negative delay", "name: x\ndelay: -2s\nsteps: [{id: a, action: echo}]", spec.ReasonMalformed, "negative"},
		{"huge delay", "name: x\ndelay: 9000h\nsteps: [{id: a, action: echo}]", spec.ReasonInvalidValue, "delay"},
		{"expires before start", "name: x\nrun_at: 2030-01-02T00:00:00Z\nexpires_at: 2030-01-01T00:00:00Z\nsteps: [{id: a, action: echo}]", spec.ReasonInvalidValue, "before it may start"},
		{"expires_at and ttl", "name: x\nexpires_at: 2030-01-01T00:00:00Z\nttl: 1m\nsteps: [{id: a, action: echo}]", spec.ReasonInvalidValue, "not both"},
		{"step ttl and expires_in", "name: x\nsteps: [{id: a, action: echo, ttl: 1m, expires_in: 1m}]", spec.ReasonInvalidValue, "expires_in"},
		{"concurrency without key", "name: x\nconcurrency: {limit: 1}\nsteps: [{id: a, action: echo}]", spec.ReasonMissingField, "concurrency.key"},
		{"concurrency zero limit", "name: x\nsteps: [{id: a, action: echo, concurrency: {key: c-42, limit: 0}}]", spec.ReasonInvalidValue, "steps[0].concurrency.limit"},
		{"concurrency bad key", "name: x\nsteps: [{id: a, action: echo, concurrency: {key: 'c 42', limit: 1}}]", spec.ReasonInvalidID, "c 42"},
		{"rate limit bad name", "name: x\nsteps: [{id: a, action: echo, rate_limit: 'a.b'}]", spec.ReasonInvalidID, "rate_limit"},
		{"compensate without action", "name: x\nsteps: [{id: a, action: echo, compensate: {params: {x: 1}}}]", spec.ReasonMissingField, "steps[0].compensate.action"},
		{"compensate bad retries", "name: x\nsteps: [{id: a, action: echo, compensate: {action: echo, max_retries: 101}}]", spec.ReasonInvalidValue, "compensate.max_retries"},
		{"compensate unknown field", "name: x\nsteps: [{id: a, action: echo, compensate: {action: echo, undo: true}}]", spec.ReasonUnknownField, "undo"},
		{"compensation id taken", "name: x\nsteps: [{id: a, action: echo, compensate: {action: echo}}, {id: a_compensate, action: echo}]", spec.ReasonDuplicateStep, "a_compensate"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := spec.Parse([]byte(c.in), spec.Limits{})
			if err == nil {
				t.Fatalf("accepted, want %s", c.reason)
			}
			if got := spec.ReasonOf(err); got != c.reason {
				t.Fatalf("reason %q, want %q (%v)", got, c.reason, err)
			}
			if !strings.Contains(err.Error(), c.mention) {
				t.Fatalf("error %q does not mention %q", err, c.mention)
			}
		})
	}
}

func TestWorkflowFieldsAccepted(t *testing.T) {
	t.Parallel()
	// run_at may be at most a year ahead (maxDelay): a day from now.
	runAt := time.Now().UTC().Add(24 * time.Hour).Truncate(time.Second)
	expiresAt := runAt.Add(time.Hour)
	in := `
name: charge
priority: high
run_at: "` + runAt.Format(time.RFC3339) + `"
expires_at: ` + expiresAt.Format(time.RFC3339) + `
concurrency: {key: customer-42, limit: 1}
steps:
  - id: reserve
    action: echo
    compensate: {action: echo, params: {message: release}, max_retries: 5}
  - id: charge
    action: echo
    depends_on: [reserve]
    priority: critical
    ttl: 30s
    rate_limit: payments-api
    concurrency: {key: psp, limit: 10}
    compensate: {action: refund, pool: payments, timeout: 1m}
`
	j, err := spec.Parse([]byte(in), spec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	sub := runAt.Add(-24 * time.Hour)
	if got := j.StartAt(sub); !got.Equal(runAt) {
		t.Fatalf("start %v", got)
	}
	if got := j.StepExpiryAt(j.Steps[1], sub); !got.Equal(sub.Add(30 * time.Second)) {
		t.Fatalf("step expiry %v", got)
	}
	if got := j.StepExpiryAt(j.Steps[0], sub); !got.Equal(expiresAt) {
		t.Fatalf("job expiry on step %v", got)
	}
	if j.StepPriority(j.Steps[0]) != spec.PriorityHigh || j.StepPriority(j.Steps[1]) != spec.PriorityCritical {
		t.Fatalf("priorities %v %v", j.StepPriority(j.Steps[0]), j.StepPriority(j.Steps[1]))
	}
	if keys := j.StepConcurrency(j.Steps[1]); len(keys) != 2 || keys[0].Key != "customer-42" || keys[1].Limit != 10 {
		t.Fatalf("keys %+v", keys)
	}
	c, ok := j.Steps[1].CompensationStep()
	if !ok || c.ID != "charge_compensate" || c.Action != "refund" || c.Pool != "payments" || c.RateLimit != "payments-api" {
		t.Fatalf("compensation step %+v", c)
	}
	d, err := spec.Parse([]byte(`{"name":"later","delay":"2s","ttl":"1m","steps":[{"id":"a","action":"echo"}]}`), spec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.StartAt(sub); !got.Equal(sub.Add(2 * time.Second)) {
		t.Fatalf("delayed start %v", got)
	}
	if (&spec.Job{}).StartAt(sub) != (time.Time{}) {
		t.Fatal("a job without run_at or delay starts at once")
	}
}

func TestEffectiveRankAges(t *testing.T) {
	t.Parallel()
	const aging = 30 * time.Second
	for _, c := range []struct {
		p      spec.Priority
		waited time.Duration
		want   int
	}{
		{spec.PriorityLow, 0, 0},
		{spec.PriorityLow, 29 * time.Second, 0},
		{spec.PriorityLow, 30 * time.Second, 1},
		{spec.PriorityLow, 95 * time.Second, 3},
		{spec.PriorityLow, time.Hour, 3},
		{"", 0, 1},
		{spec.PriorityCritical, time.Hour, 3},
	} {
		if got := c.p.EffectiveRank(c.waited, aging); got != c.want {
			t.Errorf("%q after %s: rank %d, want %d", c.p, c.waited, got, c.want)
		}
	}
	if got := spec.PriorityLow.EffectiveRank(time.Hour, 0); got != 0 {
		t.Errorf("aging off: rank %d", got)
	}
}

// A cluster step's undo goes through the same cluster to the member that
// owns its target, unless the compensation names a pool or an agent of its
// own: it lost both, and ran on the default pool's agents, or none.
func TestCompensationOfAClusterStepKeepsItsCluster(t *testing.T) {
	t.Parallel()
	j, err := spec.Parse([]byte(`{"name":"c","steps":[
		{"id":"a","action":"deploy","cluster":"web","target":"site-1","compensate":{"action":"undeploy"}},
		{"id":"b","action":"deploy","cluster":"web","target":"site-2","compensate":{"action":"undeploy","pool":"ops"}}]}`), spec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := j.Steps[0].CompensationStep()
	if a.Cluster != "web" || a.Target != "site-1" || a.Pool != "" || a.Agent != "" {
		t.Fatalf("a's compensation: cluster %q, target %q, pool %q, agent %q; want web, site-1 and no pool or agent", a.Cluster, a.Target, a.Pool, a.Agent)
	}
	b, _ := j.Steps[1].CompensationStep()
	if b.Cluster != "" || b.Target != "" || b.Pool != "ops" {
		t.Fatalf("b's compensation: cluster %q, target %q, pool %q; want the ops pool outside the cluster", b.Cluster, b.Target, b.Pool)
	}
	if err := j.Validate(spec.Limits{}); err != nil {
		t.Fatal(err)
	}
	// Each is a valid step as it stands (a cluster step names no pool).
	undo := spec.Job{Name: "undo", Steps: []spec.Step{a, b}}
	if err := undo.Validate(spec.Limits{}); err != nil {
		t.Fatalf("the compensation steps as a job: %v", err)
	}
}

func TestRankOrNormal(t *testing.T) {
	t.Parallel()
	for p, want := range map[spec.Priority]int{spec.PriorityLow: 0, "": 1, spec.PriorityNormal: 1,
		spec.PriorityHigh: 2, spec.PriorityCritical: 3, "urgent": 1} {
		if got := p.RankOrNormal(); got != want {
			t.Errorf("%q: %d, want %d", p, got, want)
		}
	}
}

// A job's timeout is a duration like the others: bounded, never negative.
func TestJobTimeoutIsValidated(t *testing.T) {
	t.Parallel()
	j, err := spec.Parse([]byte(`{"name":"t","timeout":"90m","steps":[{"id":"a","action":"echo"}]}`), spec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if j.Timeout.Std() != 90*time.Minute {
		t.Fatalf("timeout %s", j.Timeout)
	}
	_, err = spec.Parse([]byte(`{"name":"t","timeout":"9000h","steps":[{"id":"a","action":"echo"}]}`), spec.Limits{})
	var ve *spec.ValidationError
	if !errors.As(err, &ve) || ve.Field != "timeout" {
		t.Fatalf("a timeout over 366 days: %v", err)
	}
}

// A job's retry settings are checked as a step's are.
func TestJobRetrySettingsAreValidated(t *testing.T) {
	t.Parallel()
	for in, field := range map[string]string{
		`{"name":"r","max_retries":101,"steps":[{"id":"a","action":"echo"}]}`:                "max_retries",
		`{"name":"r","retry":{"base_backoff":"9000h"},"steps":[{"id":"a","action":"echo"}]}`: "retry.base_backoff",
		`{"name":"r","retry":{"multiplier":0.5},"steps":[{"id":"a","action":"echo"}]}`:       "retry",
		`{"name":"r","steps":[{"id":"a","action":"echo","max_retries":-1}]}`:                 "steps[0].max_retries",
	} {
		_, err := spec.Parse([]byte(in), spec.Limits{})
		var ve *spec.ValidationError
		if !errors.As(err, &ve) || ve.Field != field {
			t.Errorf("%s: %v, want an error on %s", in, err, field)
		}
	}
}

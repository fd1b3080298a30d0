package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/api"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// leased writes job id as the scheduler does right after dispatching its
// first step to agent-1 (an inline job keeps its steps in the job record)
// and returns the dispatch's lease token.
func (b bundle) leased(t *testing.T, id string, inline bool) string {
	t.Helper()
	sp := spec.Job{Name: "leased", Steps: []spec.Step{{ID: "a", Action: "echo", Params: map[string]any{"message": "hi"}}}}
	if !inline {
		sp.Steps = append(sp.Steps, spec.Step{ID: "b", Action: "echo", DependsOn: []string{"a"}})
	}
	now := time.Now().UTC()
	steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	token := protocol.NewLeaseToken()
	if err := steps[0].Dispatch("agent-1", token, now, time.Second); err != nil {
		t.Fatal(err)
	}
	j := jobstore.NewJob(id, sp, now)
	j.State = jobstore.JobRunning
	if inline {
		j.Inline, j.Steps = true, steps
	} else {
		for _, s := range steps {
			if _, err := b.store.CreateStep(ctx(t), s); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := b.store.CreateJob(ctx(t), j); err != nil {
		t.Fatal(err)
	}
	return token
}

// leasedLetter stores the dead letter of job's step a as an agent copies
// its task: the task's headers (Warden-Token too) and body.
func (b bundle) leasedLetter(t *testing.T, job, token string) uint64 {
	t.Helper()
	task := protocol.Task{JobID: job, StepID: "a", Epoch: 1, Attempt: 1, Action: "echo", Token: token}
	m := nats.NewMsg(protocol.DLQSubject("default", "agent-1"))
	m.Data, _ = json.Marshal(task)
	m.Header.Set(protocol.HeaderJob, job)
	m.Header.Set(protocol.HeaderStep, "a")
	m.Header.Set(protocol.HeaderEpoch, "1")
	m.Header.Set(protocol.HeaderToken, token)
	m.Header.Set(protocol.HeaderDLQReason, string(protocol.DLQMaxDeliveries))
	ack, err := b.js.PublishMsg(ctx(t), m)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// A dispatched step's lease token is half of its result's dedup id: a
// reader who learns it can take that id first, and the genuine result is
// then dropped as a duplicate. No read route serves it, to a read token or
// to an anonymous reader (docker-compose's API serves anonymous reads):
// not in a job's steps, not in an inline job's record, not in a dead
// letter's headers or payload. The rest stays: a dispatched step shows its
// actor and lease.
func TestNoReadRouteServesALeaseToken(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *api.Config) { c.AnonymousScope = api.ScopeRead })
	tokens := []string{b.leased(t, "job-steps", false), b.leased(t, "job-inline", true)}
	letter := b.leasedLetter(t, "job-steps", tokens[0])

	paths := []string{
		"/api/v1/jobs/job-steps", "/api/v1/jobs/job-inline", "/api/v1/jobs",
		"/api/v1/queues/dead-letters", fmt.Sprintf("/api/v1/queues/dead-letters/%d", letter),
	}
	for _, who := range []string{"", readToken} {
		for _, p := range paths {
			r := b.call(t, "GET", p, who, nil)
			if r.status != http.StatusOK {
				t.Fatalf("GET %s: %d %s", p, r.status, r.body)
			}
			body := string(r.body)
			for _, tok := range tokens {
				if i := strings.Index(body, tok); i >= 0 {
					t.Errorf("GET %s (token %q) serves a lease token: ...%s...", p, who, body[max(i-60, 0):min(i+40, len(body))])
				}
			}
			if i := strings.Index(body, `"token"`); i >= 0 {
				t.Errorf("GET %s (token %q) has a \"token\" member: ...%s...", p, who, body[max(i-60, 0):min(i+60, len(body))])
			}
			if strings.Contains(strings.ToLower(body), strings.ToLower(protocol.HeaderToken)) {
				t.Errorf("GET %s (token %q) serves the %s header: %s", p, who, protocol.HeaderToken, body)
			}
		}
	}

	// The views are otherwise whole: the step is dispatched to agent-1
	// under a lease, with its params; the letter names its step and keeps
	// its other headers and its task.
	for _, id := range []string{"job-steps", "job-inline"} {
		var d struct {
			Job struct {
				Steps []map[string]any `json:"steps"`
			} `json:"job"`
			Steps []map[string]any `json:"steps"`
		}
		b.call(t, "GET", "/api/v1/jobs/"+id, "", nil).decode(t, &d)
		shown := d.Steps
		if id == "job-inline" {
			shown = append(shown, d.Job.Steps...)
		}
		if len(shown) == 0 {
			t.Fatalf("%s: no steps", id)
		}
		for _, s := range shown {
			if s["id"] != "a" {
				continue
			}
			if s["state"] != "dispatched" || s["actor"] != "agent-1" || s["locked_until"] == nil || s["epoch"] != 1.0 || s["params"] == nil {
				t.Errorf("%s: step a %v, want it dispatched to agent-1 with its lease and params", id, s)
			}
		}
	}
	var l struct {
		JobID   string              `json:"job_id"`
		StepID  string              `json:"step_id"`
		Headers map[string][]string `json:"headers"`
		Payload map[string]any      `json:"payload"`
	}
	b.call(t, "GET", fmt.Sprintf("/api/v1/queues/dead-letters/%d", letter), "", nil).decode(t, &l)
	if l.JobID != "job-steps" || l.StepID != "a" || len(l.Headers[protocol.HeaderJob]) != 1 || l.Payload["job_id"] != "job-steps" || l.Payload["action"] != "echo" {
		t.Errorf("dead letter: %+v", l)
	}
	// What the API leaves out is still stored: the scheduler needs it.
	if st, _, err := b.store.Step(ctx(t), "job-steps", "a"); err != nil || st.Token != tokens[0] {
		t.Fatalf("stored step: %+v %v", st, err)
	}
}

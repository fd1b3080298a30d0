package scheduler_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// A job id that is not a token is refused (invalid_id) however the
// submission names it, every time. Before, it was replaced by the
// placeholder "invalid", itself a valid id: the first such submission
// created job "invalid", and every later one was answered existing:true,
// its spec dropped without an event.
func TestInvalidJobIDIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	body := []byte(`{"name":"bad","steps":[{"id":"s","action":"echo"}]}`)
	for _, id := range []string{"job@one", "job@two"} {
		r := b.submitOn(t, protocol.SubmitSubject(id), body, nil)
		if r.Error == "" || r.Existing || !strings.Contains(r.Error, id) {
			t.Fatalf("submission on %s: got %+v, want it refused for its id", protocol.SubmitSubject(id), r)
		}
	}
	// On the bare subject, the header's id is refused as what it is, not as
	// a disagreement with a placeholder.
	r := b.submitOn(t, protocol.SubjectSubmit, body, map[string]string{protocol.HeaderJobID: "a@b"})
	if r.Error == "" || !strings.Contains(r.Error, `"a@b" may contain only`) {
		t.Fatalf("Warden-Job-Id a@b: got %+v, want it refused for its id", r)
	}
	natstest.Eventually(t, 10*time.Second, "three invalid_id events", func() bool {
		n := 0
		for _, e := range b.events(t, protocol.EventSubmissionRejected, "invalid") {
			if e.Data["reason"] == spec.ReasonInvalidID && e.Data["submitted_id"] != "" {
				n++
			}
		}
		return n == 3
	})
	if _, _, err := b.store.Job(context.Background(), "invalid"); !errors.Is(err, jobstore.ErrNotFound) {
		t.Fatalf(`job "invalid" exists (or cannot be read: %v)`, err)
	}
}

// A result whose subject names a job id that is not a token is refused as
// for no job. Before, it was routed as job "unknown" and, if a job of that
// name had a step of the same id, judged against it: with that dispatch's
// epoch and token it was applied to the other job.
func TestResultForAnInvalidJobIDIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	release := startHolder(t, b)
	b.submitNoReply(t, []byte(`{"name":"u","steps":[{"id":"s","action":"echo"}]}`), "unknown")
	var st *jobstore.Step
	natstest.Eventually(t, 10*time.Second, "unknown.s dispatched", func() bool {
		var err error
		st, _, err = b.store.Step(context.Background(), "unknown", "s")
		return err == nil && st.State == jobstore.StepDispatched
	})
	now := time.Now().UTC()
	forged := protocol.Result{JobID: "j@x", StepID: "s", Epoch: st.Epoch, Token: st.Token, Agent: "holder", Pool: "default",
		Status: protocol.ResultSucceeded, StartedAt: now, FinishedAt: now}
	m := nats.NewMsg(protocol.ResultSubject("default", "holder", "j@x", "s"))
	m.Data = mustJSON(t, forged)
	if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	refused := func() bool {
		for _, e := range b.events(t, protocol.EventResultRejected, "unknown") {
			if strings.Contains(e.Data["subject"], "j@x") && e.Data["reason"] == "unknown_job" {
				return true
			}
		}
		return false
	}
	natstest.Eventually(t, 10*time.Second, "the result handled", func() bool {
		s, _, err := b.store.Step(context.Background(), "unknown", "s")
		return refused() || (err == nil && s.State != jobstore.StepDispatched)
	})
	if s, _, err := b.store.Step(context.Background(), "unknown", "s"); err != nil || s.State != jobstore.StepDispatched {
		t.Fatalf("a result for job j@x changed job unknown's step: %v %v", s.State, err)
	}
	if !refused() {
		t.Fatal("no result_rejected unknown_job event for job j@x")
	}
	release()
	b.waitJob(t, "unknown", jobstore.JobSucceeded)
}

package scheduler_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// A result for a step that the scheduler's cached copy of the job lacks
// (added since by the scheduler that owned the job while this one did not,
// e.g. a compensation step) is judged against the stored job, not
// rejected: rejected, the step waited for its lease (make chaos, a saga).
func TestResultForAStepAddedElsewhereIsApplied(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	ctx := context.Background()
	now := time.Now().UTC()
	sp := spec.Job{Name: "grows", Steps: []spec.Step{{ID: "a", Action: "noop"}, {ID: "b", Action: "noop"}}}
	job := jobstore.NewJob("job-grows", sp, now)
	job.State = jobstore.JobRunning
	if _, err := b.store.CreateJob(ctx, job); err != nil {
		t.Fatal(err)
	}
	steps, err := jobstore.NewSteps(job.ID, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range steps {
		_ = st.Dispatch("agent-1", "", now, time.Hour)
		if _, err := b.store.CreateStep(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	stepState := func(id string) jobstore.StepState {
		st, _, err := b.store.Step(ctx, job.ID, id)
		if err != nil {
			return ""
		}
		return st.State
	}
	// The scheduler reads the job for a's result and keeps it (b runs on).
	b.publishResult(t, job.ID, "a")
	natstest.Eventually(t, 10*time.Second, "a succeeded", func() bool { return stepState("a") == jobstore.StepSucceeded })

	// Meanwhile another scheduler adds step c and dispatches it.
	stored, rev, err := b.store.Job(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	stored.Spec.Steps = append(stored.Spec.Steps, spec.Step{ID: "c", Action: "noop"})
	if _, err := b.store.UpdateJob(ctx, stored, rev); err != nil {
		t.Fatal(err)
	}
	added, err := jobstore.NewSteps(job.ID, spec.Job{Name: "grows", Steps: []spec.Step{{ID: "c", Action: "noop"}}},
		jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	_ = added[0].Dispatch("agent-1", "", now, time.Hour)
	if _, err := b.store.CreateStep(ctx, added[0]); err != nil {
		t.Fatal(err)
	}

	// c's result reaches the scheduler that cached the job without c.
	b.publishResult(t, job.ID, "c")
	natstest.Eventually(t, 10*time.Second, "c succeeded", func() bool { return stepState("c") == jobstore.StepSucceeded })
}

// publishResult publishes agent-1's succeeded result for a step at epoch 1.
func (b *bundle) publishResult(t *testing.T, job, step string) {
	t.Helper()
	now := time.Now().UTC()
	r := protocol.Result{JobID: job, StepID: step, Epoch: 1, Agent: "agent-1", Status: protocol.ResultSucceeded, StartedAt: now, FinishedAt: now}
	body, _ := json.Marshal(r)
	m := nats.NewMsg(protocol.ResultSubject("default", "agent-1", job, step))
	m.Data = body
	m.Header.Set(protocol.HeaderMsgID, protocol.ResultMsgID(job, step, 1, ""))
	if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

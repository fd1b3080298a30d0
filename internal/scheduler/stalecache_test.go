package scheduler_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
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
	storeRunningJob(t, b.store, "job-grows", sp, now)
	stepState := func(id string) jobstore.StepState {
		st, _, err := b.store.Step(ctx, "job-grows", id)
		if err != nil {
			return ""
		}
		return st.State
	}
	// The scheduler reads the job for a's result and keeps it (b runs on).
	b.publish(t, agentResult("job-grows", "a", now))
	natstest.Eventually(t, 10*time.Second, "a succeeded", func() bool { return stepState("a") == jobstore.StepSucceeded })

	// Meanwhile another scheduler adds step c and dispatches it.
	stored, rev, err := b.store.Job(ctx, "job-grows")
	if err != nil {
		t.Fatal(err)
	}
	stored.Spec.Steps = append(stored.Spec.Steps, spec.Step{ID: "c", Action: "noop"})
	if _, err := b.store.UpdateJob(ctx, stored, rev); err != nil {
		t.Fatal(err)
	}
	storeDispatched(t, b.store, "job-grows", stored.Spec.Steps[2:], now)

	// c's result reaches the scheduler that cached the job without c.
	b.publish(t, agentResult("job-grows", "c", now))
	natstest.Eventually(t, 10*time.Second, "c succeeded", func() bool { return stepState("c") == jobstore.StepSucceeded })
}

// publish stores m on its stream.
func (b *bundle) publish(t *testing.T, m *nats.Msg) {
	t.Helper()
	if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

package scheduler_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

// A failure judged on a stale cached copy of the job (the step moved on
// elsewhere: the supervisor re-dispatched it at a new epoch) loses its
// compare-and-set, and the skips of the step's dependents it caused must
// not land without it. They were written in the same round as the step,
// landed, and the dependent went from skipped back to pending when the
// job was read again (watchers saw a terminal step reopen).
func TestSkipsOfAFailureThatLostItsWriteDoNotLand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	ctx := context.Background()
	now := time.Now().UTC()
	const id = "job-stale-skip"
	sp := spec.Job{Name: "stale-skip", Steps: []spec.Step{
		{ID: "a", Action: "noop"}, {ID: "c", Action: "noop"}, {ID: "b", Action: "noop", DependsOn: []string{"a"}}}}
	job := jobstore.NewJob(id, sp, now)
	job.State = jobstore.JobRunning
	if _, err := b.store.CreateJob(ctx, job); err != nil {
		t.Fatal(err)
	}
	storeDispatched(t, b.store, id, sp.Steps[:2], now)
	pending, err := jobstore.NewSteps(id, spec.Job{Steps: sp.Steps[2:]}, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.CreateStep(ctx, pending[0]); err != nil {
		t.Fatal(err)
	}

	// Every state b's record takes (the bucket keeps only the latest).
	kv, err := b.js.KeyValue(ctx, protocol.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	watch, err := kv.Watch(ctx, protocol.StepKey(id, "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watch.Stop() }()
	var seen []string
	waited := false // b's record says what it waits for
	drain := func() {
		for {
			select {
			case e := <-watch.Updates():
				if e == nil {
					continue // the end of the initial values
				}
				var st jobstore.Step
				if err := json.Unmarshal(e.Value(), &st); err != nil {
					t.Fatal(err)
				}
				seen = append(seen, string(st.State))
				waited = waited || st.Waiting != ""
			default:
				return
			}
		}
	}

	// The scheduler reads the job for c's result and keeps it.
	b.publish(t, agentResult(id, "c", now))
	natstest.Eventually(t, 10*time.Second, "c succeeded", func() bool {
		st, _, err := b.store.Step(ctx, id, "c")
		return err == nil && st.State == jobstore.StepSucceeded
	})
	// The supervisor moves a to another agent at epoch 2.
	b.editStep(t, id, "a", func(st *jobstore.Step) {
		if err := st.Release("transferred", "agent-1 left", false, now); err != nil {
			t.Fatal(err)
		}
		if err := st.Dispatch("agent-2", "", now, time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	moved, _, err := b.store.Step(ctx, id, "a")
	if err != nil || moved.Epoch != 2 {
		t.Fatalf("a after the move: epoch %v, %v; want 2", moved, err)
	}

	// agent-1's permanent failure at epoch 1 reaches the cached copy.
	failed := agentResult(id, "a", now)
	r := protocol.Result{JobID: id, StepID: "a", Epoch: 1, Agent: "agent-1", Status: protocol.ResultFailed,
		Error: "boom", ErrorClass: protocol.ClassPermanent, StartedAt: now, FinishedAt: now}
	failed.Data, _ = json.Marshal(r)
	b.publish(t, failed)
	// Read again, the result is stale: the scheduler records that.
	natstest.Eventually(t, 10*time.Second, "stale result event", func() bool {
		s, err := b.js.Stream(ctx, protocol.StreamEvents)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(protocol.EventSubject(protocol.EventStaleResult, id)))
		return err == nil && info.State.Msgs >= 1
	})
	// agent-2's success at epoch 2 makes b ready; no agent is there to
	// take it, and the scheduler writes what it waits for. That turn comes
	// after the stale one, so once b's watch shows it every earlier state
	// of b's record has been seen.
	ok := protocol.Result{JobID: id, StepID: "a", Epoch: 2, Agent: "agent-2", Status: protocol.ResultSucceeded, StartedAt: now, FinishedAt: now}
	okMsg := nats.NewMsg(protocol.ResultSubject("default", "agent-2", id, "a"))
	okMsg.Data, _ = json.Marshal(ok)
	okMsg.Header.Set(protocol.HeaderMsgID, protocol.ResultMsgID(id, "a", 2, ""))
	b.publish(t, okMsg)
	natstest.Eventually(t, 10*time.Second, "b waiting for an agent", func() bool {
		drain()
		return waited
	})
	for _, s := range seen {
		if s != string(jobstore.StepPending) {
			t.Fatalf("b's record went through %v: a's failure lost its write, its skip of b must not land", seen)
		}
	}
}

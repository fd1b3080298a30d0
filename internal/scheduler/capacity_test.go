package scheduler_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/handagent"
)

// A step that finds every agent at max_concurrent waits: its record says
// why, and it runs once the slot is free.
func TestStepWaitingForASlotSaysWhy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	release := oneSlotAgent(t, b, "job-first")
	step := func(id string) *jobstore.Step {
		j, _, err := b.store.Job(context.Background(), id)
		if err != nil || len(j.Steps) != 1 {
			return nil
		}
		return j.Steps[0]
	}
	one := []byte(`{"name":"one","steps":[{"id":"s","action":"echo"}]}`)
	b.submitNoReply(t, one, "job-first")
	natstest.Eventually(t, 10*time.Second, "first step dispatched", func() bool {
		st := step("job-first")
		return st != nil && st.State == jobstore.StepDispatched
	})
	b.submitNoReply(t, one, "job-second")
	natstest.Eventually(t, 10*time.Second, "second step pending, saying it waits for a slot", func() bool {
		st := step("job-second")
		return st != nil && st.State == jobstore.StepPending && strings.Contains(st.Waiting, "at capacity")
	})
	close(release)
	b.waitJob(t, "job-first", jobstore.JobSucceeded)
	b.waitJob(t, "job-second", jobstore.JobSucceeded)
}

// A job waiting for a slot keeps its submission unacknowledged in the
// scheduler, extended past the ack wait, instead of handing it back to
// the stream to be redelivered every capacity_retry: the server delivers
// it once, and the job still starts as soon as the slot frees.
func TestWaitingJobIsHeldNotRedelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ackWait := time.Second
	b.startScheduler(t, scheduler.Config{AckWait: protocol.Duration(ackWait), CapacityRetry: protocol.Duration(100 * time.Millisecond)})
	release := oneSlotAgent(t, b, "job-first")
	one := []byte(`{"name":"one","steps":[{"id":"s","action":"echo"}]}`)
	b.submitNoReply(t, one, "job-first")
	natstest.Eventually(t, 10*time.Second, "first step dispatched", func() bool {
		j, _, err := b.store.Job(context.Background(), "job-first")
		return err == nil && j.Steps[0].State == jobstore.StepDispatched
	})
	b.submitNoReply(t, one, "job-second")
	natstest.Eventually(t, 10*time.Second, "second step waits for the slot", func() bool {
		j, _, err := b.store.Job(context.Background(), "job-second")
		return err == nil && strings.Contains(j.Steps[0].Waiting, "at capacity")
	})
	// The stimulus, not a wait for a result: three ack waits in which a
	// handed-back (or unextended) submission would have come back.
	time.Sleep(3 * ackWait)
	if n, _ := consumerTotals(t, b.js, protocol.StreamSubmit); n != 0 {
		t.Fatalf("the server redelivered %d submissions while the job waited for a slot", n)
	}
	close(release)
	b.waitJob(t, "job-first", jobstore.JobSucceeded)
	b.waitJob(t, "job-second", jobstore.JobSucceeded)
	natstest.Eventually(t, 10*time.Second, "both submissions acknowledged", func() bool {
		_, pending := consumerTotals(t, b.js, protocol.StreamSubmit)
		return pending == 0
	})
	if n, _ := consumerTotals(t, b.js, protocol.StreamSubmit); n != 0 {
		t.Fatalf("the server redelivered %d submissions", n)
	}
}

// consumerTotals sums, over the stream's consumers, the messages delivered
// more than once and those awaiting an ack.
func consumerTotals(t *testing.T, js jetstream.JetStream, stream string) (redelivered, pending int) {
	t.Helper()
	for _, info := range consumerInfos(t, js, stream) {
		redelivered += info.NumRedelivered
		pending += info.NumAckPending
	}
	return redelivered, pending
}

func consumerInfos(t *testing.T, js jetstream.JetStream, stream string) []*jetstream.ConsumerInfo {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.ConsumerInfo
	l := s.ListConsumers(context.Background())
	for info := range l.Info() {
		out = append(out, info)
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// oneSlotAgent starts the only agent, with one slot, whose handler holds
// the task of job holdJob until the returned channel is closed.
func oneSlotAgent(t *testing.T, b *bundle, holdJob string) chan struct{} {
	t.Helper()
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "only", Pool: "default", MaxConcurrent: 1})
	release := make(chan struct{})
	a.Script(func(ctx context.Context, task *agent.Task) (any, error) {
		if task.JobID == holdJob {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return "ok", nil
	})
	return release
}

// Steps that cannot go (here a pool with no agent) do not hold back the
// job's other ready steps, however many there are. A turn takes a slice of
// four; those put back went to the front of the ready list, so with four
// of them the next turn took the same four, the step behind them was never
// reached, and the worker spun on the job at full speed. Once the agent
// joins, the blocked steps run too: the end of a round leaves them waiting
// for an agent, not forgotten.
func TestBlockedStepsDoNotHoldBackTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	handagent.Start(t, b.js, "default", "a1", nil)
	b.submitNoReply(t, []byte(`{"name":"x","steps":[
	 {"id":"n0","action":"echo","pool":"nobody"},
	 {"id":"n1","action":"echo","pool":"nobody"},
	 {"id":"n2","action":"echo","pool":"nobody"},
	 {"id":"n3","action":"echo","pool":"nobody"},
	 {"id":"n4","action":"echo","pool":"nobody"},
	 {"id":"ok","action":"echo"}]}`), "job-blocked")
	natstest.Eventually(t, 10*time.Second, "the step behind five blocked ones succeeds", func() bool {
		st, _, err := b.store.Step(context.Background(), "job-blocked", "ok")
		return err == nil && st.State == jobstore.StepSucceeded
	})
	handagent.Start(t, b.js, "nobody", "n1", nil)
	b.waitJob(t, "job-blocked", jobstore.JobSucceeded)
}

// A submission rejected before the job's state is read (unparseable, here)
// that names a job waiting for an agent leaves that job waiting. The turn
// settled the waiting job's held messages with the bad input's: acked, the
// waiter dropped, and nothing in the scheduler woke the job again (only a
// supervisor's recovery, after its grace, would have).
func TestRejectedSubmissionLeavesAWaitingJobWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	b.submitNoReply(t, []byte(`{"name":"w","steps":[{"id":"s","action":"echo","pool":"late"}]}`), "job-w")
	natstest.Eventually(t, 10*time.Second, "the job waits for an agent", func() bool {
		st, _, err := b.store.Step(context.Background(), "job-w", "s")
		return err == nil && st.State == jobstore.StepPending && st.Waiting != ""
	})
	b.submitNoReply(t, []byte(`this is : not [ a spec`), "job-w")
	natstest.Eventually(t, 10*time.Second, "the bad submission settled", func() bool {
		return pending(t, b.js, protocol.StreamSubmit) < 2
	})
	if n, pending := pending(t, b.js, protocol.StreamSubmit), pendingAcks(t, b.js, protocol.StreamSubmit); n != 1 || pending != 1 {
		t.Fatalf("after the bad submission: %d submissions stored, %d held; want the waiting job's, held", n, pending)
	}
	handagent.Start(t, b.js, "late", "l1", nil)
	b.waitJob(t, "job-w", jobstore.JobSucceeded)
}

func pendingAcks(t *testing.T, js jetstream.JetStream, stream string) int {
	t.Helper()
	_, pending := consumerTotals(t, js, stream)
	return pending
}

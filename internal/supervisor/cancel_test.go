package supervisor_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/handagent"
)

// Issue 15: cancel was not durable: when the agent did not confirm, the
// supervisor re-dispatched the cancelled job's step and the job ended
// "succeeded (desired cancelled)". Cancel wins now: the step of a job being
// cancelled whose agent never confirms ends cancelled when its lease ends,
// and is never dispatched again.
func TestCancelledStepEndsCancelledWhenItsLeaseEnds(t *testing.T) {
	t.Parallel()
	b := setup(t,
		scheduler.Config{DispatchGrace: protocol.Duration(200 * time.Millisecond)},
		supervisor.Config{FailureThreshold: protocol.Duration(time.Hour), RecoveryRetry: protocol.Duration(200 * time.Millisecond)})
	ctx := context.Background()
	sink := handagent.Start(t, b.js, "default", "sink", []string{"x"})
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	sink.Reply(func(protocol.Task) protocol.Result { <-hold; return protocol.Result{Status: handagent.Drop} })
	b.submit(t, "job-cancel", "name: c\nsteps: [{id: s, action: echo, requires: [x], timeout: 1s}]")
	natstest.Eventually(t, 10*time.Second, "sink got the task", func() bool { return len(sink.Received()) == 1 })
	// The sink freezes: it will neither run nor confirm a cancel. A healthy
	// agent that could take the step is there.
	sink.Stop()
	good := handagent.Start(t, b.js, "default", "good", []string{"x"})
	rep, err := ops.New(b.nc, b.store).CancelJob(ctx, "job-cancel")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cancel: %+v", rep)
	natstest.Eventually(t, 20*time.Second, "the job ends cancelled", func() bool {
		j, _, err := b.store.Job(ctx, "job-cancel")
		return err == nil && j.State == jobstore.JobCancelled
	})
	st := b.step(t, "job-cancel", "s")
	if st.State != jobstore.StepCancelled || st.Epoch != 1 || len(st.Attempts) != 1 {
		raw, _ := json.Marshal(st)
		t.Fatalf("step not ended cancelled at its first dispatch: %s", raw)
	}
	if n := len(good.Received()); n != 0 {
		t.Fatalf("the cancelled step was dispatched again (%d tasks to good)", n)
	}
	evs := b.events(t, protocol.EventStepCancelled)
	if len(evs) != 1 || evs[0].JobID != "job-cancel" || evs[0].Agent != "sink" {
		t.Fatalf("step_cancelled events: %+v", evs)
	}
	t.Logf("step: %s, %q; event: %s", st.State, st.LastError, evs[0].Reason)
}

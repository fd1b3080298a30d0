package supervisor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// A job's timeout does not rest on the wake its scheduler armed: that
// scheduler may be gone, and a deadline beyond the wake horizon arms none.
// The leader asks for the job at its deadline (the record's
// Warden-Deadline header), and the scheduler that answers times it out.
// Here the job's step runs for a minute on its agent; the scheduler that
// accepted it goes; its deadline is then brought forward to a second from
// now (as if an hour had passed) and the job must fail "timed out" well
// before its step would have ended.
func TestLeaderAsksForAJobAtItsDeadline(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	ctx, store := context.Background(), b.store
	stopFirst := b.scheduler(t, scheduler.Config{})
	v := b.supervisor(t, supervisor.Config{FailureThreshold: protocol.Duration(time.Hour)})
	waitClosed(t, v.Leading(), "the supervisor leads")
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "a1", Pool: "default"})
	a.Script(func(ctx context.Context, _ *agent.Task) (any, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Minute):
			return "ok", nil
		}
	})
	b.submit(t, "job-deadline", `{"name":"d","timeout":"1h","steps":[{"id":"s","action":"echo","timeout":"2m"}]}`)
	natstest.Eventually(t, 10*time.Second, "the step runs", func() bool {
		j, _, err := store.Job(ctx, "job-deadline")
		return err == nil && len(j.Steps) == 1 && j.Steps[0].State == jobstore.StepDispatched
	})
	stopFirst()
	b.scheduler(t, scheduler.Config{})

	j, rev, err := store.Job(ctx, "job-deadline")
	if err != nil {
		t.Fatal(err)
	}
	j.Deadline = time.Now().UTC().Add(time.Second)
	if _, err := store.UpdateJob(ctx, j, rev); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 20*time.Second, "the job fails timed out", func() bool {
		j, _, err := store.Job(ctx, "job-deadline")
		return err == nil && j.State == jobstore.JobFailed && strings.HasPrefix(j.Error, "timed out")
	})
}

// A compensating job's desired cancel (its timeout, a cancel with
// compensation) stops nothing of its undo: a compensation step whose
// lease ran out is taken back to run again, as the scheduler would, not
// cancelled, which skipped the rest of the undo and ended the job
// compensation_failed.
func TestUndoOfATimedOutJobIsTakenBackNotCancelled(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	ctx, store := context.Background(), b.store
	long := time.Now().UTC().Add(-time.Hour)
	sp := spec.Job{Name: "trip", Timeout: protocol.Duration(time.Minute), Steps: []spec.Step{
		{ID: "seat", Action: "echo"}, {ID: "seat_compensate", Action: "echo"}}}
	j := jobstore.NewJob("job-undo", sp, long)
	j.State, j.Desired, j.TimedOut, j.ForwardSteps = jobstore.JobCompensating, jobstore.JobCancelled, true, 1
	steps, err := jobstore.NewSteps(j.ID, sp, jobstore.StepDefaults{Timeout: time.Minute}, long)
	if err != nil {
		t.Fatal(err)
	}
	steps[0].State = jobstore.StepSucceeded
	if err := steps[1].Dispatch("gone", protocol.NewLeaseToken(), long, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := store.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	for _, st := range steps {
		if _, err := store.CreateStep(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	b.supervisor(t, supervisor.Config{FailureThreshold: protocol.Duration(time.Hour),
		RecoveryGrace: protocol.Duration(200 * time.Millisecond)})
	var st *jobstore.Step
	natstest.Eventually(t, 20*time.Second, "the undo step's expired lease is recovered", func() bool {
		st = b.step(t, "job-undo", "seat_compensate")
		return st != nil && st.State != jobstore.StepDispatched
	})
	if st.State != jobstore.StepPending || st.Attempts[len(st.Attempts)-1].Status != "lease_expired" {
		t.Fatalf("undo step %s (%s), want pending again after its lease expired", st.State, st.LastError)
	}
}

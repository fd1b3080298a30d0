package scheduler_test

import (
	"context"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/test/handagent"
)

// storeChain stores job a -> b -> c in state job, with a succeeded and b
// and c in the states given, as a partly applied operator reopen leaves it.
func storeChain(t *testing.T, b *bundle, id string, job jobstore.JobState, sb, sc jobstore.StepState) {
	t.Helper()
	ctx := context.Background()
	sp := spec.Job{Name: "chain", Steps: []spec.Step{{ID: "a", Action: "echo"},
		{ID: "b", Action: "echo", DependsOn: []string{"a"}}, {ID: "c", Action: "echo", DependsOn: []string{"b"}}}}
	now := time.Now().UTC()
	j := jobstore.NewJob(id, sp, now)
	j.State = job
	if job.Terminal() {
		j.FinishedAt, j.Error = now, "step b failed: boom"
	}
	if _, err := b.store.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	steps[0].State, steps[0].FinishedAt = jobstore.StepSucceeded, now
	steps[1].State, steps[2].State = sb, sc
	if sc == jobstore.StepSkipped {
		steps[2].FinishedAt, steps[2].LastError = now, "a dependency did not succeed"
	}
	for _, st := range steps {
		if _, err := b.store.CreateStep(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
}

// An operator's reopen applied in part (dlq retry, job retry): the step
// written pending and the job left failed, or the job reopened and a
// skipped dependent left skipped. The scheduler finishes the reopen: the
// job runs again and every step runs. Before, the pending step was
// dispatched for a job that stayed failed; and the skipped one never ran
// while its job ended succeeded.
func TestSchedulerFinishesAPartlyAppliedReopen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	handagent.Start(t, b.js, "default", "r-1", nil)
	storeChain(t, b, "job-stranded", jobstore.JobFailed, jobstore.StepPending, jobstore.StepSkipped)
	storeChain(t, b, "job-left-skipped", jobstore.JobRunning, jobstore.StepPending, jobstore.StepSkipped)
	for _, id := range []string{"job-stranded", "job-left-skipped"} {
		b.advance(t, id)
		j := b.waitJob(t, id, jobstore.JobSucceeded)
		steps, err := b.store.Steps(context.Background(), j)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range steps {
			if st.State != jobstore.StepSucceeded {
				t.Fatalf("%s: step %s %s", id, st.ID, st.State)
			}
		}
	}
}

// A finished job one of whose step records expired ahead of its own (the
// retention's TTLs end a moment apart) is still finished: an advance, a
// late result or a resubmission in that moment does not create the step
// again, pending, nor run it.
func TestFinishedJobWithAnExpiredStepRecordStaysFinished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	a := handagent.Start(t, b.js, "default", "r-1", nil)
	storeChain(t, b, "job-expiring", jobstore.JobSucceeded, jobstore.StepSucceeded, jobstore.StepSucceeded)
	if err := b.store.KV().Purge(context.Background(), protocol.StepKey("job-expiring", "b")); err != nil {
		t.Fatal(err)
	}
	b.advance(t, "job-expiring")
	// The advance is answered once its turn's writes landed.
	if _, _, err := b.store.Step(context.Background(), "job-expiring", "b"); err == nil {
		t.Fatal("the expired step record of a finished job was created again")
	}
	if j, _, err := b.store.Job(context.Background(), "job-expiring"); err != nil || j.State != jobstore.JobSucceeded {
		t.Fatalf("the job after an advance: %v %v", j.State, err)
	}
	if got := a.Received(); len(got) != 0 {
		t.Fatalf("the agent was given %d tasks of a finished job", len(got))
	}
}

// A cancel that raced the last result (recorded after the job's steps had
// all succeeded, before the job's own record said so) stopped nothing:
// the job ends succeeded, and a cancel that asked for compensation undoes
// nothing, as a cancel of the finished job would have been refused.
func TestCancelThatStoppedNothingLeavesTheJobSucceeded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	a := handagent.Start(t, b.js, "default", "r-1", nil)
	for _, compensate := range []bool{false, true} {
		id := "job-late-cancel"
		if compensate {
			id += "-compensate"
		}
		storeChain(t, b, id, jobstore.JobRunning, jobstore.StepSucceeded, jobstore.StepSucceeded)
		b.editJob(t, id, func(j *jobstore.Job) { j.Desired, j.CompensateOnCancel = jobstore.JobCancelled, compensate })
		b.advance(t, id)
		natstest.Eventually(t, 10*time.Second, id+" ended", func() bool {
			j, _, err := b.store.Job(context.Background(), id)
			return err == nil && j.State.Terminal()
		})
		if j, _, _ := b.store.Job(context.Background(), id); j.State != jobstore.JobSucceeded {
			t.Fatalf("%s: %s (%s), want succeeded", id, j.State, j.Error)
		}
	}
	if got := a.Received(); len(got) != 0 {
		t.Fatalf("the agent was given %d tasks (compensation of finished work?)", len(got))
	}
}

// A cancel that reached a running step (told it to stop: desired
// cancelled) ends the job cancelled even if the step came back
// successful: only a cancel that stopped nothing leaves it succeeded.
func TestCancelThatReachedAStepEndsCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	storeChain(t, b, "job-reached", jobstore.JobRunning, jobstore.StepSucceeded, jobstore.StepSucceeded)
	// Told to stop while it ran; it succeeded anyway.
	b.editStep(t, "job-reached", "c", func(st *jobstore.Step) { st.Desired = jobstore.StepCancelled })
	b.editJob(t, "job-reached", func(j *jobstore.Job) { j.Desired = jobstore.JobCancelled })
	b.advance(t, "job-reached")
	b.waitJob(t, "job-reached", jobstore.JobCancelled)
}

// A finished job whose records are expiring (one is gone already) is not
// reopened for a pending step: the steps whose records expired would
// stand in as succeeded, and their dependents would run as if they had.
func TestExpiringJobIsNotReopened(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	a := handagent.Start(t, b.js, "default", "r-1", nil)
	storeChain(t, b, "job-expiring-reopen", jobstore.JobFailed, jobstore.StepPending, jobstore.StepSkipped)
	if err := b.store.KV().Purge(context.Background(), protocol.StepKey("job-expiring-reopen", "a")); err != nil {
		t.Fatal(err)
	}
	b.advance(t, "job-expiring-reopen")
	if j, _, err := b.store.Job(context.Background(), "job-expiring-reopen"); err != nil || j.State != jobstore.JobFailed {
		t.Fatalf("the expiring job after an advance: %v %v", j.State, err)
	}
	if _, _, err := b.store.Step(context.Background(), "job-expiring-reopen", "a"); err == nil {
		t.Fatal("the expired step record was written again")
	}
	if got := a.Received(); len(got) != 0 {
		t.Fatalf("the agent was given %d tasks of an expiring job", len(got))
	}
}

// advance asks a scheduler to advance job, as dlq.Kick does, but until one
// is there to answer (the scheduler may still be starting); the answer
// comes once the job's turn has written what it changed.
func (b *bundle) advance(t *testing.T, job string) {
	t.Helper()
	natstest.Eventually(t, 10*time.Second, "a scheduler asked to advance "+job, func() bool {
		_, err := b.nc.Request(protocol.SubjectControlAdvance, []byte(job), time.Second)
		return err == nil
	})
}

// A forward step reopened as its job's compensation ended (a reopen that
// raced dlq's refusal) is not run beside, or after, the undo: it ends
// cancelled, its record with the retention. Before, it stayed pending in
// the finished job for good, and the supervisor asked about it for ever.
func TestStepReopenedAfterCompensationEndsCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	a := handagent.Start(t, b.js, "default", "r-1", nil)
	storeChain(t, b, "job-undone", jobstore.JobCompensated, jobstore.StepPending, jobstore.StepSkipped)
	ctx := context.Background()
	b.editJob(t, "job-undone", func(j *jobstore.Job) { j.ForwardSteps = len(j.Spec.Steps) })
	b.advance(t, "job-undone")
	st, _, err := b.store.Step(ctx, "job-undone", "b")
	if err != nil || st.State != jobstore.StepCancelled {
		t.Fatalf("the step reopened after the compensation: %v %v", st.State, err)
	}
	if b.recordTTL(t, protocol.StepKey("job-undone", "b")) == "" {
		t.Fatal("its record has no retention TTL")
	}
	if j, _, _ := b.store.Job(ctx, "job-undone"); j.State != jobstore.JobCompensated {
		t.Fatalf("the job after the advance: %s", j.State)
	}
	if got := a.Received(); len(got) != 0 {
		t.Fatalf("the agent was given %d tasks of a compensated job", len(got))
	}
}

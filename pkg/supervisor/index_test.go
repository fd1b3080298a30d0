package supervisor

import (
	"testing"
	"time"

	"github.com/wardenhq/warden/pkg/jobstore"
)

func TestIndexOrdersByDueAndForgetsConsistentSteps(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(10_000, 0)
	x := NewIndex(30 * time.Second)
	x.ObserveJob(&jobstore.Job{ID: "j", State: jobstore.JobRunning, UpdatedAt: t0})
	x.ObserveStep(&jobstore.Step{JobID: "j", ID: "late", State: jobstore.StepDispatched, LockedUntil: t0.Add(time.Minute), UpdatedAt: t0})
	x.ObserveStep(&jobstore.Step{JobID: "j", ID: "soon", State: jobstore.StepDispatched, LockedUntil: t0.Add(time.Second), UpdatedAt: t0})
	x.ObserveStep(&jobstore.Step{JobID: "j", ID: "pend", State: jobstore.StepPending, UpdatedAt: t0})
	if next, _ := x.Next(); !next.Equal(t0.Add(time.Second)) {
		t.Fatalf("next due %v", next)
	}
	due := x.PopDue(t0.Add(31 * time.Second))
	if len(due) != 2 || due[0].step != "soon" || due[1].step != "pend" {
		t.Fatalf("due %+v", due)
	}
	// The late step succeeds: nothing of the job is left but a job check,
	// since the job is unfinished and none of its steps is in flight.
	x.ObserveStep(&jobstore.Step{JobID: "j", ID: "soon", State: jobstore.StepSucceeded, UpdatedAt: t0.Add(2 * time.Second)})
	x.ObserveStep(&jobstore.Step{JobID: "j", ID: "pend", State: jobstore.StepSucceeded, UpdatedAt: t0.Add(3 * time.Second)})
	x.ObserveStep(&jobstore.Step{JobID: "j", ID: "late", State: jobstore.StepSucceeded, UpdatedAt: t0.Add(4 * time.Second)})
	if x.Len() != 1 {
		t.Fatalf("%d items, want the job check only", x.Len())
	}
	due = x.PopDue(t0.Add(time.Hour))
	if len(due) != 1 || due[0].kind != itemJob || !due[0].due.Equal(t0.Add(34*time.Second)) {
		t.Fatalf("job check %+v", due)
	}
	// The job finishes: the index forgets it.
	x.ObserveJob(&jobstore.Job{ID: "j", State: jobstore.JobSucceeded, UpdatedAt: t0.Add(5 * time.Second)})
	if x.Len() != 0 || len(x.jobs) != 0 || len(x.inconsistent) != 0 {
		t.Fatalf("index kept %d items, %d jobs, %d steps", x.Len(), len(x.jobs), len(x.inconsistent))
	}
}

func TestIndexReschedulesRenewedLease(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(10_000, 0)
	x := NewIndex(time.Second)
	x.ObserveStep(&jobstore.Step{JobID: "j", ID: "s", State: jobstore.StepDispatched, LockedUntil: t0.Add(time.Second)})
	x.ObserveStep(&jobstore.Step{JobID: "j", ID: "s", State: jobstore.StepDispatched, LockedUntil: t0.Add(time.Hour)})
	if got := x.PopDue(t0.Add(time.Minute)); len(got) != 0 {
		t.Fatalf("renewed lease came due: %+v", got)
	}
	if x.Len() != 1 {
		t.Fatalf("len %d", x.Len())
	}
}

// A step that ends while a dependent is still pending must bring the job
// back if nobody moves it on: found by the chaos suite (seed 572240), where
// a step parked as poison during a failover left its dependent pending and
// its job running forever.
func TestIndexChecksJobAfterAStepEndsWithOthersPending(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(10_000, 0)
	x := NewIndex(30 * time.Second)
	x.ObserveJob(&jobstore.Job{ID: "j", State: jobstore.JobRunning, UpdatedAt: t0})
	x.ObserveStep(&jobstore.Step{JobID: "j", ID: "bad", State: jobstore.StepDispatched, LockedUntil: t0.Add(time.Hour), UpdatedAt: t0})
	x.ObserveStep(&jobstore.Step{JobID: "j", ID: "after", State: jobstore.StepPending, UpdatedAt: t0})
	_ = x.PopDue(t0.Add(31 * time.Second)) // the pending step's own check, long before
	x.ObserveStep(&jobstore.Step{JobID: "j", ID: "bad", State: jobstore.StepDeadLettered, UpdatedAt: t0.Add(time.Minute)})
	due := x.PopDue(t0.Add(time.Minute + 31*time.Second))
	if len(due) != 1 || due[0].kind != itemJob || due[0].job != "j" {
		t.Fatalf("no job check after the step ended: %+v", due)
	}
}

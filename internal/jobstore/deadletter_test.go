package jobstore_test

import (
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
)

// A dead-lettered step still showed its last attempt as dispatched
// (`warden job show`: "#1 epoch 1 on crash-1: dispatched"): parking it
// changed the step and left the attempt open. The attempt ends with it.
func TestDeadLetterEndsTheCurrentAttempt(t *testing.T) {
	t.Parallel()
	st := storeJob(t, "job-dlq", 1, 0)
	ctx := testCtx(t)
	s, rev, err := st.Step(ctx, "job-dlq", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := s.Dispatch("crash-1", "tok", started, 0); err != nil {
		t.Fatal(err)
	}
	if rev, err = st.UpdateStep(ctx, s, rev); err != nil {
		t.Fatal(err)
	}
	parked := started.Add(time.Minute)
	const reason = "delivered 5 times to agent crash-1 without an ack"
	s.DeadLetter(reason, parked)
	if _, err := st.UpdateStep(ctx, s, rev); err != nil {
		t.Fatal(err)
	}

	got, _, err := st.Step(ctx, "job-dlq", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != jobstore.StepDeadLettered || len(got.Attempts) != 1 {
		t.Fatalf("step %s with %d attempts, want dead_lettered with 1", got.State, len(got.Attempts))
	}
	a := got.Attempts[0]
	if a.Status != string(jobstore.StepDeadLettered) || a.Error != reason || !a.FinishedAt.Equal(parked) ||
		!a.StartedAt.Equal(started) || a.Agent != "crash-1" || a.Epoch != 1 {
		t.Fatalf("attempt #1 after dead-lettering: %+v, want dead_lettered at %s with %q", a, parked, reason)
	}
}

// A transfer that gives up ends the attempt itself (transfer_timeout)
// before it parks the step: dead-lettering keeps that end. A step not
// dispatched has no running attempt to end.
func TestDeadLetterKeepsAnAttemptAlreadyEnded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0).UTC()
	s := &jobstore.Step{JobID: "j", ID: "s", State: jobstore.StepPending, Desired: jobstore.StepSucceeded}
	_ = s.Dispatch("a1", "", now, 0)
	a := &s.Attempts[0]
	a.Status, a.Error, a.FinishedAt = "transfer_timeout", "nobody took it up", now
	s.DeadLetter("transfer gave up", now.Add(time.Second))
	if got := s.Attempts[0]; got.Status != "transfer_timeout" || got.Error != "nobody took it up" || !got.FinishedAt.Equal(now) {
		t.Fatalf("transfer's end overwritten: %+v", got)
	}

	r := &jobstore.Step{JobID: "j", ID: "r", State: jobstore.StepPending, Desired: jobstore.StepSucceeded}
	_ = r.Dispatch("a1", "", now, 0)
	_ = r.Release("lease_expired", "lease expired", true, now)
	r.DeadLetter("poison", now.Add(time.Second))
	if got := r.Attempts[0]; got.Status != "lease_expired" || got.Error != "lease expired" {
		t.Fatalf("released attempt overwritten: %+v", got)
	}
}

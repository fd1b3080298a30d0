package scheduler

import (
	"fmt"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/spec"
)

// endedJob is the state of a job of n steps that have all succeeded, read
// from the store with the records of the steps in expiring carrying the
// retention TTL already.
func endedJob(t *testing.T, n int, expiring ...int) *jobState {
	t.Helper()
	var sp spec.Job
	for i := range n {
		sp.Steps = append(sp.Steps, spec.Step{ID: fmt.Sprintf("s%03d", i), Action: "echo"})
	}
	now := time.Now().UTC()
	steps, err := jobstore.NewSteps("job-seal", sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	snap := &jobstore.Snapshot{Job: jobstore.NewJob("job-seal", sp, now), JobRev: 1, Steps: steps, Revs: map[string]uint64{}, Expiring: map[string]bool{}}
	for _, st := range steps {
		st.State, st.FinishedAt = jobstore.StepSucceeded, now
		snap.Revs[st.ID] = 2
	}
	for _, i := range expiring {
		snap.Expiring[steps[i].ID] = true
	}
	js, err := newJobState(snap, now, true)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// A job of 150 ended steps seals 64 records a turn, skipping the two a
// reload found sealed already, and ends on the third.
func TestSealSlicesAndResumes(t *testing.T) {
	js := endedJob(t, 150, 3, 100)
	for turn, want := range []struct {
		done  bool
		dirty int
	}{{false, 64}, {false, 64}, {true, 20}} {
		done := js.settleExpiry()
		if done != want.done || len(js.dirtySteps) != want.dirty {
			t.Fatalf("turn %d: done %v with %d records to write, want %v and %d", turn+1, done, len(js.dirtySteps), want.done, want.dirty)
		}
		for i := range js.dirtySteps {
			if i == 3 || i == 100 {
				t.Fatalf("turn %d writes step %d again, whose record carries the TTL already", turn+1, i)
			}
			if !js.expiring[i] {
				t.Fatalf("turn %d writes step %d without the TTL", turn+1, i)
			}
		}
		clear(js.dirtySteps)
	}
	if js.nexpiring != 150 {
		t.Fatalf("%d records sealed, want 150", js.nexpiring)
	}
}

// A job whose steps are open again (a cancel with compensation or a dlq
// retry that came while it sealed) takes the TTL back from every record
// that has it, so none expires while it runs.
func TestUnsealWhenStepsAreOpenAgain(t *testing.T) {
	js := endedJob(t, 4, 0, 2)
	js.settleExpiry()
	if js.dirtySteps[0] || js.dirtySteps[2] || !js.expiring[0] || !js.expiring[2] {
		t.Fatal("a job whose steps have all ended unsealed its records")
	}
	js = endedJob(t, 4, 0, 2)
	js.steps[3].State = jobstore.StepPending // reopened
	js.index(time.Now())
	if !js.settleExpiry() || len(js.dirtySteps) != 2 || !js.dirtySteps[0] || !js.dirtySteps[2] || js.expiring[0] || js.expiring[2] || js.nexpiring != 0 {
		t.Fatalf("unseal: dirty %v, expiring %v (%d)", js.dirtySteps, js.expiring, js.nexpiring)
	}
}

// A large job opened again takes the TTL back 64 records a turn, as it
// was given.
func TestUnsealSlices(t *testing.T) {
	js := endedJob(t, 150, seq(150)...)
	js.steps[0].State = jobstore.StepPending
	js.index(time.Now())
	for turn, want := range []struct {
		done  bool
		dirty int
	}{{false, 64}, {false, 64}, {true, 22}} {
		if done := js.settleExpiry(); done != want.done || len(js.dirtySteps) != want.dirty {
			t.Fatalf("turn %d: done %v with %d records to write, want %v and %d", turn+1, done, len(js.dirtySteps), want.done, want.dirty)
		}
		for i := range js.dirtySteps {
			if js.expiring[i] {
				t.Fatalf("turn %d writes step %d with the TTL", turn+1, i)
			}
		}
		clear(js.dirtySteps)
	}
	if js.nexpiring != 0 {
		t.Fatalf("%d records still expiring", js.nexpiring)
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

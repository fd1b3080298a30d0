package jobstore_test

import (
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
)

// A cluster member's refusal (class reroute) sends a cluster step back to
// pending without counting the attempt or an error.
func TestRerouteIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	now := time.Now()
	st := &jobstore.Step{JobID: "j", ID: "s", Cluster: "c", State: jobstore.StepPending, Desired: jobstore.StepSucceeded, MaxRetries: 0, Timeout: protocol.Duration(time.Second)}
	for range 5 {
		if err := st.Dispatch("a", "tok", now, 0); err != nil {
			t.Fatal(err)
		}
		out, err := st.ApplyResult(protocol.Result{JobID: "j", StepID: "s", Epoch: st.Epoch, Token: "tok", Agent: "a",
			Status: protocol.ResultFailed, Error: "cluster: this member is not the leader", ErrorClass: protocol.ClassReroute}, false, now)
		if err != nil || out != jobstore.OutcomeRetry || st.State != jobstore.StepPending {
			t.Fatalf("outcome %v state %s err %v", out, st.State, err)
		}
	}
	if st.Attempt != 0 || st.ErrorCount != 0 || st.Epoch != 5 {
		t.Fatalf("attempt %d errors %d epoch %d", st.Attempt, st.ErrorCount, st.Epoch)
	}
}

// Refusals are free only in a cluster and only so many in a row: a member
// refusing for good, or an agent outside a cluster sending the class,
// routed the step four times a second for ever.
func TestReroutesInARowEndInAttempts(t *testing.T) {
	t.Parallel()
	now := time.Now()
	refuse := func(st *jobstore.Step) jobstore.Outcome {
		t.Helper()
		if err := st.Dispatch("a", "tok", now, 0); err != nil {
			t.Fatal(err)
		}
		r := protocol.Result{JobID: "j", StepID: "s", Epoch: st.Epoch, Token: "tok", Agent: "a",
			Status: protocol.ResultFailed, Error: "cluster: not defined here", ErrorClass: protocol.ClassReroute}
		// The scheduler retries a refusal that is not free as a retriable failure.
		out, err := st.ApplyResult(r, true, now)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	plain := &jobstore.Step{JobID: "j", ID: "s", State: jobstore.StepPending, Desired: jobstore.StepSucceeded, MaxRetries: 1, Timeout: protocol.Duration(time.Second)}
	refuse(plain)
	if plain.Attempt != 1 || plain.ErrorCount != 1 {
		t.Fatalf("a reroute outside a cluster: attempt %d, errors %d; want it counted", plain.Attempt, plain.ErrorCount)
	}
	if out := refuse(plain); out != jobstore.OutcomeFailed || plain.State != jobstore.StepFailed {
		t.Fatalf("its second: outcome %v, state %s; want failed (max_retries 1)", out, plain.State)
	}
	st := &jobstore.Step{JobID: "j", ID: "s", Cluster: "c", State: jobstore.StepPending, Desired: jobstore.StepSucceeded, MaxRetries: 2, Timeout: protocol.Duration(time.Second)}
	for i := range jobstore.MaxFreeReroutes {
		if out := refuse(st); out != jobstore.OutcomeRetry || st.Attempt != 0 {
			t.Fatalf("refusal %d: outcome %v, attempt %d; want a free reroute", i+1, out, st.Attempt)
		}
	}
	for i := range 2 {
		if out := refuse(st); out != jobstore.OutcomeRetry || st.Attempt != i+1 {
			t.Fatalf("refusal %d in a row: outcome %v, attempt %d; want it counted", jobstore.MaxFreeReroutes+i+1, out, st.Attempt)
		}
	}
	if out := refuse(st); out != jobstore.OutcomeFailed || st.State != jobstore.StepFailed {
		t.Fatalf("past its retries: outcome %v, state %s; want failed", out, st.State)
	}
}

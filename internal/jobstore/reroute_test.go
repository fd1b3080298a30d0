package jobstore_test

import (
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
)

// A cluster member's refusal (class reroute) sends the step back to
// pending without counting the attempt or an error.
func TestRerouteIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	now := time.Now()
	st := &jobstore.Step{JobID: "j", ID: "s", State: jobstore.StepPending, Desired: jobstore.StepSucceeded, MaxRetries: 0, Timeout: protocol.Duration(time.Second)}
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

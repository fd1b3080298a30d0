package dlq

import (
	"errors"
	"testing"

	"github.com/wardenhq/warden/internal/jobstore"
)

// A job that timed out was cancelled to stop its steps but ended failed:
// once it has ended, its dead letters may be retried as any failed job's;
// while it is still stopping, or when an operator cancelled it, not.
func TestTimedOutJobsLettersMayBeRetried(t *testing.T) {
	t.Parallel()
	letter := reopenRequest{step: "s", keepCancel: true}
	ended := &jobstore.Job{ID: "j", Desired: jobstore.JobCancelled, TimedOut: true, State: jobstore.JobFailed}
	if err := refuse(ended, letter); err != nil {
		t.Fatalf("timed out and ended: %v", err)
	}
	var jc *JobCancelledError
	stopping := &jobstore.Job{ID: "j", Desired: jobstore.JobCancelled, TimedOut: true, State: jobstore.JobRunning}
	if err := refuse(stopping, letter); !errors.As(err, &jc) {
		t.Fatalf("timed out, still stopping: %v", err)
	}
	cancelled := &jobstore.Job{ID: "j", Desired: jobstore.JobCancelled, State: jobstore.JobFailed}
	if err := refuse(cancelled, letter); !errors.As(err, &jc) {
		t.Fatalf("cancelled by an operator: %v", err)
	}
}

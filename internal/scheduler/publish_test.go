package scheduler_test

import (
	"context"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
	"github.com/wardenhq/warden/test/handagent"
)

// The dispatch of a step lands in the store but its task is not stored
// (in chaos: published as nats-server restarted). The job's inputs are
// handed back rather than acked, and their redelivery re-reads the job and
// publishes the task again: the step runs at the same epoch long before
// its lease ends (5m30s), where it used to wait for the lease.
func TestTaskNotStoredIsPublishedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	agent := handagent.Start(t, b.js, "default", "lost", nil)
	ctx := context.Background()
	// The scheduler applies the streams as it starts: change one only
	// once a job has gone through.
	handagent.Start(t, b.js, "default", "warm", nil)
	if _, err := b.js.Publish(ctx, protocol.SubmitSubject("job-warm"),
		[]byte(`{"name":"w","steps":[{"id":"s","action":"echo","agent":"warm"}]}`)); err != nil {
		t.Fatal(err)
	}
	b.waitJob(t, "job-warm", jobstore.JobSucceeded)
	// The agent's task stream refuses every message for a while.
	ts, err := b.js.Stream(ctx, protocol.TaskStream(protocol.Shard("default", "lost", streams.DefaultTaskShards)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := ts.CachedInfo().Config
	refusing := cfg
	refusing.MaxMsgSize = 1
	if _, err := b.js.UpdateStream(ctx, refusing); err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.Publish(ctx, protocol.SubmitSubject("job-lost-task"),
		[]byte(`{"name":"l","steps":[{"id":"s","action":"echo","agent":"lost"}]}`)); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, "the step dispatched", func() bool {
		j, _, err := b.store.Job(ctx, "job-lost-task")
		return err == nil && len(j.Steps) == 1 && j.Steps[0].State == jobstore.StepDispatched
	})
	if _, err := b.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	j := b.waitJob(t, "job-lost-task", jobstore.JobSucceeded)
	if st := j.Steps[0]; st.Epoch != 1 {
		t.Fatalf("step ran at epoch %d, want 1 (the same dispatch)", st.Epoch)
	}
	if n := len(agent.Received()); n != 1 {
		t.Fatalf("agent received %d tasks, want 1", n)
	}
}

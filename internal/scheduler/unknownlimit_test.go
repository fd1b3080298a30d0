package scheduler_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ratelimit"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
)

// A rate limit removed from the configuration (an edit and a restart)
// while a job that names it runs: once the step has waited the grace on
// the unknown limit it fails, with an event, and the job fails and undoes
// what it did. It waited for ever ("rate limit crm: unknown rate limit"),
// its job running.
func TestUnknownRateLimitFailsTheStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	withCRM := scheduler.Config{RateLimits: ratelimit.Config{"crm": {Limit: 10, Interval: protocol.Duration(time.Second)}}}
	nc1, _ := b.srv.Connect(t)
	ctx1, stop1 := context.WithCancel(context.Background())
	done1 := runScheduler(ctx1, t, nc1, withCRM)
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	ran := scriptedAgent(t, b, func(task *agent.Task) error {
		if task.StepID == "a" {
			started <- struct{}{}
			<-release
		}
		return nil
	})
	publishJobs(t, b, 1, "sync", `{"name":"sync","steps":[
 {"id":"a","action":"echo","compensate":{"action":"echo"}},
 {"id":"b","action":"echo","depends_on":["a"],"rate_limit":"crm"}]}`)
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("step a never started")
	}
	// The scheduler restarts without the limit while a runs.
	stop1()
	if err := <-done1; err != nil {
		t.Fatalf("scheduler: %v", err)
	}
	b.startScheduler(t, scheduler.Config{WaitRetry: protocol.Duration(100 * time.Millisecond)},
		scheduler.WithUnknownLimitGrace(time.Second))
	close(release)
	job := b.waitJobWithin(t, "sync-0000", jobstore.JobCompensated, 30*time.Second)
	st, _, err := b.store.Step(context.Background(), "sync-0000", "b")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != jobstore.StepFailed || !strings.Contains(st.LastError, `unknown rate limit "crm"`) || st.Epoch != 0 {
		t.Fatalf("b %s at epoch %d with error %q", st.State, st.Epoch, st.LastError)
	}
	if !strings.Contains(job.Error, "step b failed") {
		t.Fatalf("job error %q", job.Error)
	}
	if got := ran(); got != "a a_compensate" {
		t.Fatalf("executions %q", got)
	}
	natstest.Eventually(t, 5*time.Second, "an event for b", func() bool {
		evs, err := events.List(context.Background(), b.js, protocol.EventStepFailedUnknownLimit, 0)
		return err == nil && len(evs) == 1 && evs[0].StepID == "b" && evs[0].Data["rate_limit"] == "crm"
	})
	t.Logf("job %s (%s)", job.State, job.Error)
}

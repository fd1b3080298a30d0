package scheduler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/agent"
)

// A job's max_retries and retry are the retry settings of the steps that
// set neither: a takes the job's (no retry), b keeps its own (two).
func TestJobRetrySettingsAreItsStepsDefaults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	scriptedAgent(t, b, func(*agent.Task) error { return agent.Retriable(errors.New("busy")) })
	publishJobs(t, b, 1, "retries", `{"name":"retries","max_retries":0,"retry":{"base_backoff":"10ms","max_backoff":"10ms"},"steps":[
 {"id":"a","action":"echo"},
 {"id":"b","action":"echo","max_retries":2,"retry":{"base_backoff":"10ms","max_backoff":"10ms"}}]}`)
	job := b.waitJobWithin(t, "retries-0000", jobstore.JobFailed, 20*time.Second)
	for id, want := range map[string]int{"a": 1, "b": 3} {
		st, _, err := b.store.Step(context.Background(), job.ID, id)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != jobstore.StepFailed || st.Attempt != want {
			t.Errorf("step %s %s after %d attempts (max_retries %d), want failed after %d", id, st.State, st.Attempt, st.MaxRetries, want)
		}
	}
}

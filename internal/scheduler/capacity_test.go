package scheduler_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
)

// A step that finds every agent at max_concurrent waits: its record says
// why, and it runs once the slot is free.
func TestStepWaitingForASlotSaysWhy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "only", Pool: "default", MaxConcurrent: 1})
	release := make(chan struct{})
	a.Script(func(ctx context.Context, task *agent.Task) (any, error) {
		if task.JobID == "job-first" {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return "ok", nil
	})
	step := func(id string) *jobstore.Step {
		j, _, err := b.store.Job(context.Background(), id)
		if err != nil || len(j.Steps) != 1 {
			return nil
		}
		return j.Steps[0]
	}
	one := []byte(`{"name":"one","steps":[{"id":"s","action":"echo"}]}`)
	b.submitNoReply(t, one, "job-first")
	natstest.Eventually(t, 10*time.Second, "first step dispatched", func() bool {
		st := step("job-first")
		return st != nil && st.State == jobstore.StepDispatched
	})
	b.submitNoReply(t, one, "job-second")
	natstest.Eventually(t, 10*time.Second, "second step pending, saying it waits for a slot", func() bool {
		st := step("job-second")
		return st != nil && st.State == jobstore.StepPending && strings.Contains(st.Waiting, "at capacity")
	})
	close(release)
	b.waitJob(t, "job-first", jobstore.JobSucceeded)
	b.waitJob(t, "job-second", jobstore.JobSucceeded)
}

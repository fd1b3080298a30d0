package scheduler_test

import (
	"context"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
)

// A fan-out of steps that require a capability may hold at most its share
// of the slots of the agents that can run them. The share was counted
// over every agent offering the action: a job of gpu steps in a pool of 2
// gpu and 2 cpu agents (1 slot each) took both gpu slots, and a small gpu
// job beside it waited for the fan-out to end. (Found by a reviewer.)
//
// Old code: "timed out after 10s: job-small's gpu step started beside the
// fan-out".
func TestFairShareCountsOnlyAgentsWithTheCapabilities(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	holdingAgents(t, b, []string{"gpu"})
	dispatched := func(job, step string) bool {
		st, _, err := b.store.Step(context.Background(), job, step)
		return err == nil && st.State == jobstore.StepDispatched
	}
	b.submitNoReply(t, []byte(`{"name":"fan","steps":[
 {"id":"a","action":"echo","requires":["gpu"],"timeout":"60s"},
 {"id":"b","action":"echo","requires":["gpu"],"timeout":"60s"},
 {"id":"c","action":"echo","requires":["gpu"],"timeout":"60s"}]}`), "job-fan")
	natstest.Eventually(t, 10*time.Second, "job-fan dispatching", func() bool {
		return dispatched("job-fan", "a") || dispatched("job-fan", "b") || dispatched("job-fan", "c")
	})
	b.submitNoReply(t, []byte(`{"name":"small","steps":[{"id":"s","action":"echo","requires":["gpu"],"timeout":"60s"}]}`), "job-small")
	natstest.Eventually(t, 10*time.Second, "job-small's gpu step started beside the fan-out", func() bool {
		return dispatched("job-small", "s")
	})
	n := 0
	for _, id := range []string{"a", "b", "c"} {
		if dispatched("job-fan", id) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("job-fan holds %d of the 2 gpu slots, want 1 (its share, 0.5)", n)
	}
}

// Both shares hold: a job mixing steps that require gpu with steps that
// require nothing holds at most its share of all the action's slots, and
// capabilities listed in another order are the same share. (A review of
// the fix above: 3 of 4 slots, and 2 of the 2 gpu slots.)
func TestFairShareHoldsForMixedAndReorderedRequirements(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	holdingAgents(t, b, []string{"gpu", "fast"})
	steps := []string{"a", "b", "c", "d", "e"}
	b.submitNoReply(t, []byte(`{"name":"mix","steps":[
 {"id":"a","action":"echo","requires":["gpu","fast"],"timeout":"60s"},
 {"id":"b","action":"echo","requires":["fast","gpu"],"timeout":"60s"},
 {"id":"c","action":"echo","timeout":"60s"},
 {"id":"d","action":"echo","timeout":"60s"},
 {"id":"e","action":"echo","timeout":"60s"}]}`), "job-mix")
	count := func() (all, gpu int) {
		for _, id := range steps {
			st, _, err := b.store.Step(context.Background(), "job-mix", id)
			if err == nil && st.State == jobstore.StepDispatched {
				all++
				if len(st.Requires) > 0 {
					gpu++
				}
			}
		}
		return all, gpu
	}
	natstest.Eventually(t, 10*time.Second, "job-mix at its share of the 4 slots", func() bool {
		all, _ := count()
		return all == 2
	})
	b.submitNoReply(t, []byte(`{"name":"small","steps":[{"id":"s","action":"echo","timeout":"60s"}]}`), "job-small")
	natstest.Eventually(t, 10*time.Second, "job-small started beside job-mix", func() bool {
		st, _, err := b.store.Step(context.Background(), "job-small", "s")
		return err == nil && st.State == jobstore.StepDispatched
	})
	if all, gpu := count(); all > 2 || gpu > 1 {
		t.Fatalf("job-mix holds %d of 4 slots (%d of the 2 gpu ones), want at most 2 (1)", all, gpu)
	}
}

// holdingAgents starts four agents of pool default, one slot each, that
// hold every task until the test ends: g1 and g2 with caps, c1 and c2
// with none.
func holdingAgents(t *testing.T, b *bundle, caps []string) {
	t.Helper()
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	for _, a := range []struct {
		id   string
		caps []string
	}{{"g1", caps}, {"g2", caps}, {"c1", nil}, {"c2", nil}} {
		ag := agenttest.StartAgent(t, b.nc, agent.Config{ID: a.id, Pool: "default", Capabilities: a.caps, MaxConcurrent: 1})
		ag.Script(func(ctx context.Context, _ *agent.Task) (any, error) {
			select {
			case <-block:
			case <-ctx.Done():
			}
			return nil, nil
		})
	}
}

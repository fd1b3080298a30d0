package scheduler_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/protocol"
)

// A step taken back from its dead agent keeps its concurrency slot until
// the slot's lease ends (its task may still run, cut off). Waiting for an
// agent (none is left in its pool), it asked for the slot again at every
// try, which renewed the lease, and gave nothing back when no agent took
// it: the key stayed held by a step that ran nowhere, and a job on the
// same key whose pool has a free agent never started. (Found by a
// reviewer.)
//
// Old code: "timed out after 20s: job-live's step dispatched once
// job-dead.s's lease ended" (key k-held held by job-dead.s).
func TestWaitingRequeuedStepDoesNotHoldItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{DispatchGrace: protocol.Duration(time.Second), WaitRetry: protocol.Duration(300 * time.Millisecond)})
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "dies", Pool: "p1", MaxConcurrent: 4})
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	a.Script(func(ctx context.Context, _ *agent.Task) (any, error) {
		select {
		case <-block:
		case <-ctx.Done():
		}
		return nil, nil
	})
	agenttest.StartAgent(t, b.nc, agent.Config{ID: "alive", Pool: "p2", MaxConcurrent: 4})
	b.submitNoReply(t, []byte(`{"name":"k","steps":[{"id":"s","action":"echo","pool":"p1","timeout":"2s","concurrency":{"key":"k-held","limit":1}},
 {"id":"t","action":"echo","pool":"p1","depends_on":["s"]}]}`), "job-dead")
	waitDispatched(t, b, "job-dead", "s")
	a.Leave()
	// What the supervisor's failover writes (releaser.requeue), then its advance.
	b.editStep(t, "job-dead", "s", func(st *jobstore.Step) {
		if err := st.Release("transferred", "agent dies failed", true, time.Now().UTC()); err != nil {
			t.Fatal(err)
		}
	})
	b.advance(t, "job-dead")
	b.submitNoReply(t, []byte(`{"name":"k2","steps":[{"id":"s","action":"echo","pool":"p2","timeout":"2s","concurrency":{"key":"k-held","limit":1}}]}`), "job-live")
	// The slot's lease is 2s + 1s + 1s from the first dispatch.
	natstest.Eventually(t, 20*time.Second, "job-live's step dispatched once job-dead.s's lease ended", func() bool {
		st, _, err := b.store.Step(context.Background(), "job-live", "s")
		return err == nil && st.State != jobstore.StepPending
	})
	if ks := keyState(t, b, "k-held"); slices.Contains(ks.Holders, "job-dead.s") {
		t.Fatalf("k-held still held by job-dead.s, which runs nowhere: %+v", ks)
	}
}

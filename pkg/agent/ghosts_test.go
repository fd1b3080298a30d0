package agent_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
)

// A ghost delivery: the server counts a task as delivered and unacked, and
// never redelivers it, yet the agent never received it (seen after a
// nats-server restart). Here another connection takes the delivery and
// keeps it in progress, which looks the same from the agent and the
// consumer (num_ack_pending 1, num_redelivered 0, forever). The idle agent
// sees it on two checks a lease apart, re-creates its consumer, and the
// task is delivered to it afresh and runs.
func TestGhostDeliveryIsDeliveredAgainToAnIdleAgent(t *testing.T) {
	t.Parallel()
	b, cfg, cons := preconsumed(t, "haunted")
	var ran atomic.Int32
	b.publish(t, protocol.Task{JobID: "job-ghost", StepID: "s", Action: "work", Deadline: time.Now().Add(time.Hour)})
	ghost, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("take the delivery: %v", err)
	}
	// Keep the stolen delivery in progress, so the server never redelivers
	// it, until its consumer is gone.
	hctx, stopHaunting := context.WithCancel(context.Background())
	defer stopHaunting()
	go func() {
		for {
			if ghost.InProgress() != nil || !sleep(hctx, 200*time.Millisecond) {
				return
			}
		}
	}()

	b.start(t, cfg, func(a *agent.Agent) {
		a.Handle("work", func(context.Context, *agent.Task) (any, error) { ran.Add(1); return "done", nil })
	})
	natstest.Eventually(t, 20*time.Second, "the ghost task runs on the agent", func() bool { return ran.Load() == 1 })
	if r, _ := b.result(t, "job-ghost", "s"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("result %s: %s", r.Status, r.Error)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// Agents' task consumers were never removed: every agent id ever seen kept
// one, so a fleet that replaces hosts (autoscaling, pod names) slowed every
// ack (the server scans a shard's consumers on each) and, past 1,000 per
// shard (max_consumers), new agents could not start. The consumer now has
// an inactive_threshold. It must outlive a busy agent that does not pull
// (one slot, held longer than the threshold), go once the agent has left,
// and come back with the agent.
func TestTaskConsumerGoesOnlyAfterItsAgentLeaves(t *testing.T) {
	t.Parallel()
	s, nc, js := natstest.Start(t, streams.Options{TaskShards: testShards, PresenceTTL: time.Second})
	b := &bundle{srv: s, nc: nc, js: js}
	cfg := testConfig("inactive-1")
	cfg.MaxConcurrent = 1
	cfg.Lease = protocol.Duration(900 * time.Millisecond) // held past the threshold only by the extensions
	cfg.ConsumerInactiveThreshold = protocol.Duration(time.Second)
	shard := protocol.Shard(cfg.Pool, cfg.ID, testShards)
	consumer := func() (*jetstream.ConsumerInfo, error) {
		c, err := js.Consumer(context.Background(), protocol.TaskStream(shard), cfg.ID)
		if err != nil {
			return nil, err
		}
		return c.Info(context.Background())
	}
	// The consumer an earlier release made, without a threshold, is updated.
	old, err := streams.TaskConsumer(shard, cfg.Pool, cfg.ID, cfg.Lease.Std(), 0, cfg.MaxConcurrent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(context.Background(), protocol.TaskStream(shard), old); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	started, release := make(chan struct{}, 1), make(chan struct{})
	b.start(t, cfg, holdHandler(&runs, started, release))
	info, err := consumer()
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.InactiveThreshold != time.Second {
		t.Fatalf("task consumer inactive_threshold %s, want 1s", info.Config.InactiveThreshold)
	}

	b.publish(t, protocol.Task{JobID: "j1", StepID: "long", Action: "hold"})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the task did not start")
	}
	// Its only slot taken, the agent asks for nothing: only the held task
	// (its lease extended every 300ms) keeps the consumer.
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if _, err := consumer(); err != nil {
			t.Fatalf("the consumer of an agent holding a task went: %v", err)
		}
	}
	close(release)
	if r, _ := b.result(t, "j1", "long"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("held task: %s %s", r.Status, r.Error)
	}

	if err := b.stop(t); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 15*time.Second, "the server removes the consumer of an agent that left", func() bool {
		_, err := consumer()
		return errors.Is(err, jetstream.ErrConsumerNotFound)
	})

	// Queued while it was away: the agent that comes back gets it.
	b.publish(t, protocol.Task{JobID: "j2", StepID: "back", Action: "echo"})
	b.start(t, cfg, func(a *agent.Agent) {})
	if r, _ := b.result(t, "j2", "back"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("task queued while the agent was away: %s %s", r.Status, r.Error)
	}
	if runs.Load() != 1 {
		t.Fatalf("the held task ran %d times", runs.Load())
	}
}

// A drained agent asks for nothing, so after consumer_inactive_threshold
// the server removes its task consumer; the depth it reported then stayed
// what it last read (the consumer's info answered "not found"), and the
// supervisor's health assessment judged it on a stale queue. Held back,
// it makes the consumer again and reports the tasks queued meanwhile.
func TestDrainedAgentWhoseConsumerWentReportsItsQueue(t *testing.T) {
	t.Parallel()
	s, nc, js := natstest.Start(t, streams.Options{TaskShards: testShards, PresenceTTL: time.Second})
	b := &bundle{srv: s, nc: nc, js: js}
	cfg := testConfig("drained-1")
	cfg.ConsumerInactiveThreshold = protocol.Duration(time.Second)
	b.start(t, cfg, nil)
	if r := b.control(t, protocol.Control{Op: protocol.ControlDrain}); !r.OK {
		t.Fatalf("drain: %+v", r)
	}
	shard := protocol.Shard(cfg.Pool, cfg.ID, testShards)
	natstest.Eventually(t, 15*time.Second, "the drained agent's consumer removed by the server", func() bool {
		_, err := js.Consumer(context.Background(), protocol.TaskStream(shard), cfg.ID)
		return errors.Is(err, jetstream.ErrConsumerNotFound)
	})
	for i := range 3 {
		body, _ := json.Marshal(protocol.Task{JobID: fmt.Sprintf("q%d", i), StepID: "s", Epoch: 1, Attempt: 1, Action: "echo",
			Deadline: time.Now().Add(time.Minute)})
		if _, err := js.Publish(context.Background(), protocol.TaskSubject(shard, cfg.Pool, cfg.ID), body); err != nil {
			t.Fatal(err)
		}
	}
	natstest.Eventually(t, 10*time.Second, "the three tasks queued while its consumer was gone reported", func() bool {
		p, err := b.presence(t)
		return err == nil && p.Draining && p.QueueDepth == 3
	})
}

package agent_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/internal/testhook"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// holdHandler counts its runs and returns once release is closed.
func holdHandler(runs *atomic.Int32, started chan<- struct{}, release <-chan struct{}) func(*agent.Agent) {
	return func(a *agent.Agent) {
		a.Handle("hold", func(ctx context.Context, _ *agent.Task) (any, error) {
			runs.Add(1)
			select {
			case started <- struct{}{}:
			default:
			}
			select {
			case <-release:
				return "held", nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		})
	}
}

// holding is an agent with the "hold" handler on a server the test
// restarts, and a client that reconnects to it.
type holding struct {
	*bundle
	runs             atomic.Int32
	started, release chan struct{}
}

func startHolding(t *testing.T, cfg agent.Config) *holding {
	t.Helper()
	s, _, _ := natstest.Start(t, streams.Options{TaskShards: testShards})
	nc, js := s.ConnectReconnecting(t, 20*time.Millisecond)
	h := &holding{bundle: &bundle{srv: s, nc: nc, js: js}, started: make(chan struct{}, 1), release: make(chan struct{})}
	h.start(t, cfg, holdHandler(&h.runs, h.started, h.release))
	return h
}

func (h *holding) waitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-h.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the task did not start")
	}
}

// restartServer restarts the lone server, which forgets every consumer
// kept in memory, and waits for the client to reconnect.
func (h *holding) restartServer(t *testing.T) {
	t.Helper()
	h.srv.Down()
	h.srv.Up(t)
	natstest.Eventually(t, 10*time.Second, "client reconnected", h.nc.IsConnected)
}

// The task consumer keeps its state in memory, so a lone nats-server that
// restarts forgets it. The agent creates it again, and the new consumer
// delivers afresh the task the agent is still running: that task runs
// once, its result is stored once, and its ack settles the message.
func TestTaskRunningAcrossServerRestartRunsOnce(t *testing.T) {
	t.Parallel()
	b := startHolding(t, testConfig("a1"))
	if !b.consumerInfo(t).Config.MemoryStorage {
		t.Fatal("the task consumer is not in memory storage")
	}
	// It expires (must start by) just after it starts: the second
	// delivery comes after that, and must not report it expired under
	// the run's Nats-Msg-Id.
	expires := time.Now().Add(300 * time.Millisecond)
	b.publish(t, protocol.Task{JobID: "across", StepID: "s", Action: "hold", ExpiresAt: expires})
	b.waitStarted(t)
	natstest.Eventually(t, 5*time.Second, "the task's start-by time passed", func() bool { return time.Now().After(expires) })

	b.restartServer(t)
	// The re-created consumer has delivered the message again, to this
	// agent, which is still running it.
	natstest.Eventually(t, 10*time.Second, "task delivered by the re-created consumer", func() bool {
		c, err := b.js.Consumer(context.Background(), protocol.TaskStream(protocol.Shard("p", "a1", testShards)), "a1")
		if err != nil {
			return false
		}
		info, err := c.Info(context.Background())
		return err == nil && info.Delivered.Consumer >= 1
	})
	close(b.release)
	if r, _ := b.result(t, "across", "s"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("result %+v, want succeeded", r)
	}
	natstest.Eventually(t, 10*time.Second, "task message acked and removed", func() bool {
		return b.taskMessages(t) == 0 && b.agent.Stats().InFlight == 0
	})
	if n := b.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want once", n)
	}
}

// A redelivery of a dispatch whose result this agent already stored (its
// ack was lost) is acked without running the handler again.
func TestRedeliveryOfReportedTaskIsAckedUnrun(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	release := make(chan struct{})
	close(release)
	b := setup(t, testConfig("a1"), holdHandler(&runs, make(chan struct{}, 1), release))
	task := protocol.Task{JobID: "twice", StepID: "s", Action: "hold"}
	b.publish(t, task)
	b.result(t, "twice", "s")
	natstest.Eventually(t, 10*time.Second, "first delivery acked", func() bool { return b.taskMessages(t) == 0 })

	// The same dispatch again, as a message the stream does not
	// deduplicate: what the agent sees when its ack was lost.
	m := b.taskMsg(t, task)
	m.Header.Set(protocol.HeaderMsgID, "again")
	if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, "second delivery acked", func() bool {
		info := b.consumerInfo(t)
		return b.taskMessages(t) == 0 && info.Delivered.Consumer == 2 && info.NumAckPending == 0
	})
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want once", n)
	}
}

// A second message for a dispatch whose run has stored its result but not
// yet acked its own message (a task published again) is acked unrun at
// once: the run's ack settles only its own message, and left to it, the
// second waited a whole lease for its redelivery.
func TestSecondMessageAsRunFinishesIsAckedUnrun(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	release := make(chan struct{})
	close(release)
	s, nc, js := natstest.Start(t, streams.Options{TaskShards: testShards, PresenceTTL: time.Second})
	b := &bundle{srv: s, nc: nc, js: js}
	task := protocol.Task{JobID: "finishing", StepID: "s", Action: "hold"}
	var settledMeanwhile atomic.Bool
	var again atomic.Pointer[nats.Msg] // the second message, built once the agent is made
	// The hook runs on the agent's goroutine: it must not call t.Fatal, so
	// it hands its outcome (nil, or what went wrong) to the test goroutine.
	hookDone := make(chan error, 1)
	var hookOnce sync.Once
	hooks := &testhook.Hooks{Reported: func(job, _ string) {
		if job != task.JobID || runs.Load() != 1 {
			return
		}
		hookOnce.Do(func() { hookDone <- secondMessageWhileFinishing(b, again.Load(), &settledMeanwhile) })
	}}
	b.start(t, testConfig("a1"), holdHandler(&runs, make(chan struct{}, 1), release), testhook.Option(hooks).(agent.Option))
	m := b.taskMsg(t, task)
	m.Header.Set(protocol.HeaderMsgID, "again")
	again.Store(m)
	b.publish(t, task)
	b.result(t, task.JobID, "s")
	select {
	case err := <-hookDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the Reported hook did not run for the first run's result")
	}
	natstest.Eventually(t, 10*time.Second, "both messages acked", func() bool { return b.taskMessages(t) == 0 })
	if !settledMeanwhile.Load() {
		t.Fatal("the second message was not acked while the first run finished")
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want once", n)
	}
}

// secondMessageWhileFinishing publishes again (the first run's result is
// stored and its message not yet acked: the same dispatch arrives as a
// second message now) and waits up to 3s for the second to be acked while
// the first is still held, setting settled if it is. It runs on the agent's
// goroutine, so it returns errors rather than failing the test.
func secondMessageWhileFinishing(b *bundle, again *nats.Msg, settled *atomic.Bool) error {
	if again == nil {
		return errors.New("the first run reported before the second message was built")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := b.js.PublishMsg(ctx, again); err != nil {
		return fmt.Errorf("publish the second message: %w", err)
	}
	shard := protocol.Shard("p", b.agent.Config().ID, testShards)
	s, err := b.js.Stream(ctx, protocol.TaskStream(shard))
	if err != nil {
		return fmt.Errorf("task stream: %w", err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		info, err := s.Info(ctx)
		if err != nil {
			return fmt.Errorf("task stream info: %w", err)
		}
		if info.State.Msgs == 1 { // the second acked, the first still held here
			settled.Store(true)
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// A task consumer that an earlier release created on disk cannot be
// updated to memory storage: the agent replaces it, and the task waiting
// in the stream is delivered by the new one.
func TestDiskTaskConsumerReplaced(t *testing.T) {
	t.Parallel()
	b, cfg, _ := preconsumedOnDisk(t, "upgraded")
	b.publish(t, protocol.Task{JobID: "waiting", StepID: "s", Action: "echo"})
	b.start(t, cfg, nil)
	if r, _ := b.result(t, "waiting", "s"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("result %+v, want succeeded", r)
	}
	if !b.consumerInfo(t).Config.MemoryStorage {
		t.Fatal("the task consumer is still on disk")
	}
}

// preconsumedOnDisk is preconsumed with the consumer on disk, as releases
// before memory-storage task consumers created it.
func preconsumedOnDisk(t *testing.T, id string) (*bundle, agent.Config, jetstream.Consumer) {
	t.Helper()
	b, cfg, cons := preconsumed(t, id)
	cc := cons.CachedInfo().Config
	stream := cons.CachedInfo().Stream
	if err := b.js.DeleteConsumer(context.Background(), stream, cc.Durable); err != nil {
		t.Fatal(err)
	}
	cc.MemoryStorage = false
	cons, err := b.js.CreateConsumer(context.Background(), stream, cc)
	if err != nil {
		t.Fatal(err)
	}
	if cons.CachedInfo().Config.MemoryStorage {
		t.Fatal("set-up: the consumer is not on disk")
	}
	return b, cfg, cons
}

// An agent whose every slot is taken does not pull, so no failed pull
// tells it that a restarted lone server forgot its consumer. It restores
// the consumer on the reconnect: the run in progress keeps extending its
// lease through the restart, runs once and is not abandoned.
func TestBusyAgentKeepsItsLeaseAcrossServerRestart(t *testing.T) {
	t.Parallel()
	cfg := testConfig("busy")
	cfg.MaxConcurrent = 1
	cfg.Lease = protocol.Duration(time.Second)
	b := startHolding(t, cfg)
	b.publish(t, protocol.Task{JobID: "busy", StepID: "s", Action: "hold"})
	b.waitStarted(t)

	b.restartServer(t)
	natstest.Eventually(t, 10*time.Second, "task consumer restored", func() bool {
		_, err := b.js.Consumer(context.Background(), protocol.TaskStream(protocol.Shard("p", "busy", testShards)), "busy")
		return err == nil
	})
	// Three leases more: without the consumer, every extension finds no
	// responder and the run is abandoned within one.
	time.Sleep(3 * cfg.Lease.Std())
	close(b.release)
	if r, _ := b.result(t, "busy", "s"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("result %+v, want succeeded", r)
	}
	// The new consumer ignores the run's ack (it has not delivered the
	// message); its delivery at the next pull is acked unrun.
	natstest.Eventually(t, 20*time.Second, "task message acked and removed", func() bool {
		return b.taskMessages(t) == 0 && b.agent.Stats().InFlight == 0
	})
	if st := b.agent.Stats(); st.LeaseLost != 0 || b.runs.Load() != 1 {
		t.Fatalf("lease lost %d times, handler ran %d times; want 0 and 1", st.LeaseLost, b.runs.Load())
	}
}

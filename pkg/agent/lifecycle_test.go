package agent_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

func TestLeaseExtendedWhileHandlerRuns(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	var runs atomic.Int32
	var delivery atomic.Uint64
	cfg := testConfig("a1")
	cfg.Lease = protocol.Duration(lease)
	b := setup(t, cfg, func(a *agent.Agent) {
		a.Handle("long", func(ctx context.Context, task *agent.Task) (any, error) {
			runs.Add(1)
			delivery.Store(task.Delivery)
			select {
			case <-time.After(3 * lease):
				return "done", nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		})
	})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Action: "long"})
	r, _ := b.result(t, "j1", "s1")
	if r.Status != protocol.ResultSucceeded {
		t.Fatalf("result: %+v", r)
	}
	if got := r.FinishedAt.Sub(r.StartedAt); got < 3*lease {
		t.Fatalf("handler ran %s, want at least 3 leases", got)
	}
	if runs.Load() != 1 || delivery.Load() != 1 {
		t.Fatalf("runs=%d delivery=%d, want one run of the first delivery", runs.Load(), delivery.Load())
	}
	natstest.Eventually(t, 5*time.Second, "task acked", func() bool { return b.taskMessages(t) == 0 })
	if ci := b.consumerInfo(t); ci.NumRedelivered != 0 || ci.Delivered.Consumer != 1 {
		t.Fatalf("redelivered=%d delivered=%d, want a single delivery", ci.NumRedelivered, ci.Delivered.Consumer)
	}
}

func TestLeaseLostCancelsWithoutReport(t *testing.T) {
	t.Parallel()
	cause := make(chan error, 1)
	started := make(chan struct{})
	cfg := testConfig("a1")
	cfg.Lease = protocol.Duration(600 * time.Millisecond)
	// One slot: while the handler runs nothing pulls, so nothing re-creates
	// the consumer we delete below. Once the run is abandoned the agent
	// pulls, re-creates it, and the task comes again: that run keeps its
	// lease and waits here until the test ends, reporting nothing either.
	cfg.MaxConcurrent = 1
	var once sync.Once
	b := setup(t, cfg, func(a *agent.Agent) {
		a.Handle("work", func(ctx context.Context, _ *agent.Task) (any, error) {
			once.Do(func() { close(started) })
			<-ctx.Done()
			select {
			case cause <- context.Cause(ctx):
			default:
			}
			return nil, context.Cause(ctx)
		})
	})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Action: "work"})
	<-started
	// The server forgets the delivery: extensions get no reply any more.
	shard := protocol.Shard("p", "a1", testShards)
	if err := b.js.DeleteConsumer(context.Background(), protocol.TaskStream(shard), "a1"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-cause:
		if !errors.Is(err, agent.ErrLeaseLost) {
			t.Fatalf("handler cancelled with %v, want ErrLeaseLost", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handler not cancelled after the lease ran out")
	}
	natstest.Eventually(t, 5*time.Second, "lease loss counted", func() bool { return b.agent.Stats().LeaseLost == 1 })
	b.noResult(t, "j1", "s1")
}

func TestDeadlineCancelsAndReportsInTime(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	b := setup(t, testConfig("a1"), func(a *agent.Agent) {
		a.Handle("polite", func(ctx context.Context, _ *agent.Task) (any, error) {
			<-ctx.Done()
			return nil, context.Cause(ctx)
		})
		a.Handle("stubborn", func(context.Context, *agent.Task) (any, error) {
			<-release // ignores its context
			return "too late", nil
		})
	})
	deadline := time.Now().Add(1500 * time.Millisecond)
	b.publish(t, protocol.Task{JobID: "j1", StepID: "polite", Action: "polite", Deadline: deadline})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "stubborn", Action: "stubborn", Deadline: deadline})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "timeout", Action: "polite", Timeout: protocol.Duration(200 * time.Millisecond)})

	for step, want := range map[string]string{
		"polite":   "step deadline reached",
		"stubborn": "handler did not return after cancellation: step deadline reached",
		"timeout":  "step deadline reached: step timeout 200ms",
	} {
		r, msg := b.result(t, "j1", step)
		md, err := msg.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != protocol.ResultFailed || !strings.HasPrefix(r.Error, want) {
			t.Errorf("%s: got %+v, want error starting %q", step, r, want)
		}
		if step != "timeout" && (!md.Timestamp.Before(deadline) || !r.FinishedAt.Before(deadline)) {
			t.Errorf("%s: result stored at %s, finished %s, after the deadline %s", step, md.Timestamp, r.FinishedAt, deadline)
		}
	}
}

func TestDrainLetsInFlightFinish(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	release := make(chan struct{})
	b := setup(t, testConfig("a1"), func(a *agent.Agent) {
		a.Handle("work", func(context.Context, *agent.Task) (any, error) {
			close(started)
			<-release
			return "finished", nil
		})
	})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Action: "work"})
	<-started
	b.cancel()
	natstest.Eventually(t, 5*time.Second, "presence says draining", func() bool {
		p, err := b.presence(t)
		return err == nil && p.Draining && p.InFlight == 1
	})
	close(release)
	if err := b.stop(t); err != nil {
		t.Fatalf("run: %v", err)
	}
	if r, _ := b.result(t, "j1", "s1"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("in-flight task: %+v", r)
	}
	// Run flushed the ack; the server removes the task from the work queue
	// once the consumer has processed it.
	natstest.Eventually(t, 5*time.Second, "in-flight task acked", func() bool { return b.taskMessages(t) == 0 })
	if _, err := b.presence(t); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("presence after stop: %v", err)
	}
}

func TestDrainTimeoutHandsBack(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	// A lease of ten minutes: the server cannot redeliver the task by its
	// ack wait within the test's deadlines, only the hand-back can.
	const lease = protocol.Duration(10 * time.Minute)
	cfg := testConfig("a1")
	cfg.DrainTimeout = protocol.Duration(200 * time.Millisecond)
	cfg.Lease = lease
	b := setup(t, cfg, func(a *agent.Agent) {
		a.Handle("work", func(ctx context.Context, _ *agent.Task) (any, error) {
			close(started)
			<-ctx.Done()
			return nil, context.Cause(ctx)
		})
	})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Action: "work"})
	<-started
	if err := b.stop(t); err != nil {
		t.Fatalf("run: %v", err)
	}
	if got := b.agent.Stats().HandedBack; got != 1 {
		t.Fatalf("handed back %d, want 1", got)
	}
	b.noResult(t, "j1", "s1")
	if n := b.taskMessages(t); n != 1 {
		t.Fatalf("task stream holds %d messages, want the handed-back task", n)
	}
	// Handed back means available now, not after the lease: a restarted
	// agent gets it, as a second delivery, within result's 20 s deadline,
	// far short of the 10-minute lease.
	restart := testConfig("a1")
	restart.Lease = lease
	b.start(t, restart, func(a *agent.Agent) {
		a.Handle("work", func(_ context.Context, task *agent.Task) (any, error) { return task.Delivery, nil })
	})
	r, _ := b.result(t, "j1", "s1")
	if r.Status != protocol.ResultSucceeded || string(r.Output) != "2" {
		t.Fatalf("after restart: %+v (output %s)", r, r.Output)
	}
}

func TestDuplicateAgentRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, testConfig("a1"), nil)
	first, err := b.presence(t)
	if err != nil {
		t.Fatal(err)
	}
	second, err := agent.New(testConfig("a1"), agent.WithConn(b.nc), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = second.Run(ctx)
	var dup *presence.DuplicateError
	if !errors.As(err, &dup) {
		t.Fatalf("want *presence.DuplicateError, got %v", err)
	}
	if dup.Other.PID != os.Getpid() || !dup.Other.StartedAt.Equal(first.StartedAt) || !strings.Contains(err.Error(), "pid") {
		t.Fatalf("duplicate error does not name the first agent: %v", err)
	}
	// The first agent still works.
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Action: "echo"})
	if r, _ := b.result(t, "j1", "s1"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("first agent after duplicate: %+v", r)
	}
}

// Run returns an error once the connection it was given closes for good
// (its reconnects spent, or closed by its owner): the agent can take no
// task and send no heartbeat again. It waited for ever before, with no
// error for its caller to restart it on.
func TestRunReturnsWhenItsConnectionCloses(t *testing.T) {
	t.Parallel()
	b := setup(t, testConfig("a1"), nil)
	b.nc.Close()
	select {
	case err := <-b.done:
		b.done <- err // let the cleanup see it too
		if !errors.Is(err, nats.ErrConnectionClosed) {
			t.Fatalf("Run returned %v, want an error wrapping nats.ErrConnectionClosed", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run still running 20s after its connection closed")
	}
}

// A connection closed for good cancels the handlers in flight at once, with
// a cause wrapping nats.ErrConnectionClosed, and Run returns without waiting
// out the drain, leaving no goroutine behind: the supervisor moves the
// steps to other agents, where their work would run twice, and nothing the
// handlers finish here can be reported. Before, the handlers ran on for the
// drain timeout (30 s) and Run returned some 42 s after the close.
func TestConnectionClosedCancelsHandlersInFlight(t *testing.T) {
	t.Parallel()
	s, nc, js := natstest.Start(t, streams.Options{TaskShards: testShards, PresenceTTL: time.Second})
	b := &bundle{srv: s, nc: nc, js: js}
	started := make(chan struct{})
	var once sync.Once
	cause := make(chan error, 1)
	cfg := testConfig("a1")
	// A lease longer than the drain timeout: only the close can end the
	// handler's context before the drain would (its lease lost, 0.9 lease
	// after it started, would end it too).
	cfg.Lease = protocol.Duration(time.Minute)
	alive := labeledGoroutines(t, func() {
		b.start(t, cfg, func(a *agent.Agent) {
			a.Handle("work", func(ctx context.Context, _ *agent.Task) (any, error) {
				once.Do(func() { close(started) })
				<-ctx.Done()
				select {
				case cause <- context.Cause(ctx):
				default:
				}
				return nil, context.Cause(ctx)
			})
		})
	})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Action: "work", Deadline: time.Now().Add(2 * time.Minute)})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("handler not started")
	}

	b.nc.Close()
	select {
	case err := <-cause:
		if !errors.Is(err, nats.ErrConnectionClosed) {
			t.Fatalf("handler's context ended with cause %v, want one wrapping nats.ErrConnectionClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handler's context not done 5s after the connection closed")
	}
	if err := b.runEnds(t, 10*time.Second, "its connection closed"); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatalf("Run returned %v, want an error wrapping nats.ErrConnectionClosed", err)
	}
	noGoroutinesLeft(t, 10*time.Second, alive)
}

// A result being published when the connection closes for good is given up
// at once: every retry would fail the same way until the step's deadline
// (2 minutes here), and Run waited for the task's report past its drain,
// then left it retrying behind. Here the results stream is gone and a
// silent subscriber takes the publish, so the report is retrying when the
// connection closes.
func TestConnectionClosedEndsResultRetries(t *testing.T) {
	t.Parallel()
	s, nc, js := natstest.Start(t, streams.Options{TaskShards: testShards, PresenceTTL: time.Second})
	b := &bundle{srv: s, nc: nc, js: js}
	alive := labeledGoroutines(t, func() {
		b.start(t, testConfig("a1"), func(a *agent.Agent) {
			a.Handle("work", func(context.Context, *agent.Task) (any, error) { return "done", nil })
		})
	})
	if err := b.js.DeleteStream(context.Background(), protocol.StreamResults); err != nil {
		t.Fatal(err)
	}
	first := make(chan struct{})
	var once sync.Once
	if _, err := b.nc.Subscribe(protocol.SubjectResultPrefix+".>", func(*nats.Msg) { once.Do(func() { close(first) }) }); err != nil {
		t.Fatal(err)
	}
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Action: "work", Deadline: time.Now().Add(2 * time.Minute)})
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("no result published")
	}

	b.nc.Close()
	natstest.Eventually(t, 10*time.Second, "the task's report still retrying 10s after the connection closed",
		func() bool { return b.agent.Stats().InFlight == 0 })
	if err := b.runEnds(t, 10*time.Second, "its connection closed"); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatalf("Run returned %v, want an error wrapping nats.ErrConnectionClosed", err)
	}
	noGoroutinesLeft(t, 10*time.Second, alive)
}

// A connection that closes for good during a drain ends it: the handlers
// still running are cancelled at once, as when it closes before, instead
// of at the end of the drain timeout. A drain with the connection alive
// lets them finish (TestDrainLetsInFlightFinish).
func TestConnectionClosedDuringDrainCancelsHandlers(t *testing.T) {
	t.Parallel()
	s, nc, js := natstest.Start(t, streams.Options{TaskShards: testShards, PresenceTTL: time.Second})
	b := &bundle{srv: s, nc: nc, js: js}
	started := make(chan struct{})
	var once sync.Once
	cause := make(chan error, 1)
	cfg := testConfig("a1")
	cfg.Lease = protocol.Duration(time.Minute) // as in TestConnectionClosedCancelsHandlersInFlight
	cfg.DrainTimeout = protocol.Duration(time.Minute)
	alive := labeledGoroutines(t, func() {
		b.start(t, cfg, func(a *agent.Agent) {
			a.Handle("work", func(ctx context.Context, _ *agent.Task) (any, error) {
				once.Do(func() { close(started) })
				<-ctx.Done()
				select {
				case cause <- context.Cause(ctx):
				default:
				}
				return nil, context.Cause(ctx)
			})
		})
	})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Action: "work", Deadline: time.Now().Add(2 * time.Minute)})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("handler not started")
	}
	b.cancel()
	natstest.Eventually(t, 10*time.Second, "agent draining", func() bool {
		p, err := b.presence(t)
		return err == nil && p.Draining
	})

	b.nc.Close()
	select {
	case err := <-cause:
		if !errors.Is(err, nats.ErrConnectionClosed) {
			t.Fatalf("handler's context ended with cause %v, want one wrapping nats.ErrConnectionClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handler's context not done 5s after the connection closed")
	}
	if err := b.runEnds(t, 10*time.Second, "its connection closed"); err != nil {
		t.Fatalf("Run returned %v after a stop its caller asked for, want nil", err)
	}
	noGoroutinesLeft(t, 10*time.Second, alive)
}

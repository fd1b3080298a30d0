package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

const testShards = 2

// bundle is one agent running against its own embedded server.
type bundle struct {
	srv    *natstest.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	agent  *agent.Agent
	cancel context.CancelFunc
	done   chan error // Run's return value
}

func testConfig(id string) agent.Config {
	return agent.Config{
		ID:                id,
		Pool:              "p",
		TaskShards:        testShards,
		HeartbeatInterval: protocol.Duration(200 * time.Millisecond),
		FetchWait:         protocol.Duration(time.Second),
		LogLevel:          "debug",
	}
}

// setup starts a server with Warden's streams and an agent on it; register
// adds handlers before Run. The agent is stopped when the test ends.
func setup(t *testing.T, cfg agent.Config, register func(*agent.Agent)) *bundle {
	t.Helper()
	s, nc, js := natstest.Start(t, streams.Options{TaskShards: testShards, PresenceTTL: time.Second})
	b := &bundle{srv: s, nc: nc, js: js}
	b.start(t, cfg, register)
	return b
}

func (b *bundle) start(t *testing.T, cfg agent.Config, register func(*agent.Agent), opts ...agent.Option) {
	t.Helper()
	a, err := agent.New(cfg, append([]agent.Option{agent.WithConn(b.nc), testLogger(t)}, opts...)...)
	if err != nil {
		t.Fatalf("new agent: %v", err)
	}
	if register != nil {
		register(a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.agent, b.cancel, b.done = a, cancel, done
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(45 * time.Second):
			t.Error("agent did not stop")
		}
	})
	select {
	case <-a.Ready():
	case err := <-done:
		t.Fatalf("agent stopped before ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("agent not ready")
	}
}

// stop cancels Run and returns its error.
func (b *bundle) stop(t *testing.T) error {
	t.Helper()
	b.cancel()
	select {
	case err := <-b.done:
		b.done <- err // let the cleanup see it too
		return err
	case <-time.After(45 * time.Second):
		t.Fatal("agent did not stop")
		return nil
	}
}

// publish sends a task the way the scheduler does: JSON body and headers.
func (b *bundle) publish(t *testing.T, task protocol.Task) {
	t.Helper()
	if _, err := b.js.PublishMsg(context.Background(), b.taskMsg(t, task)); err != nil {
		t.Fatalf("publish task: %v", err)
	}
}

// taskMsg is the message publish sends for task.
func (b *bundle) taskMsg(t *testing.T, task protocol.Task) *nats.Msg {
	t.Helper()
	if task.Epoch == 0 {
		task.Epoch = 1
	}
	if task.Attempt == 0 {
		task.Attempt = 1
	}
	if task.Deadline.IsZero() {
		task.Deadline = time.Now().Add(20 * time.Second)
	}
	data, err := json.Marshal(task)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(b.agent.TaskSubject())
	m.Data = data
	m.Header.Set(protocol.HeaderJob, task.JobID)
	m.Header.Set(protocol.HeaderStep, task.StepID)
	m.Header.Set(protocol.HeaderEpoch, strconv.FormatUint(task.Epoch, 10))
	m.Header.Set(protocol.HeaderAttempt, strconv.Itoa(task.Attempt))
	m.Header.Set(protocol.HeaderAction, task.Action)
	m.Header.Set(protocol.HeaderDeadline, task.Deadline.UTC().Format(time.RFC3339Nano))
	m.Header.Set(protocol.HeaderMsgID, protocol.TaskMsgID(task.JobID, task.StepID, task.Epoch))
	return m
}

// result waits for the result of job/step in WARDEN_RESULTS.
func (b *bundle) result(t *testing.T, job, step string) (protocol.Result, jetstream.Msg) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cons, err := b.js.CreateConsumer(ctx, protocol.StreamResults, jetstream.ConsumerConfig{
		FilterSubject: "warden.result.*.*.*." + job + "." + step,
		AckPolicy:     jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatalf("results consumer: %v", err)
	}
	msg, err := cons.Next(jetstream.FetchContext(ctx))
	if err != nil {
		t.Fatalf("no result for %s/%s: %v", job, step, err)
	}
	var r protocol.Result
	if err := json.Unmarshal(msg.Data(), &r); err != nil {
		t.Fatalf("decode result: %v", err)
	}
	return r, msg
}

// noResult asserts that no result for job/step is stored.
func (b *bundle) noResult(t *testing.T, job, step string) {
	t.Helper()
	s, err := b.js.Stream(context.Background(), protocol.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.GetLastMsgForSubject(context.Background(), "warden.result.*.*.*."+job+"."+step)
	if !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("want no result for %s/%s, got err=%v", job, step, err)
	}
}

// taskMessages is how many task messages the agent's shard still holds.
func (b *bundle) taskMessages(t *testing.T) uint64 {
	t.Helper()
	shard := protocol.Shard("p", b.agent.Config().ID, testShards)
	s, err := b.js.Stream(context.Background(), protocol.TaskStream(shard))
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func (b *bundle) consumerInfo(t *testing.T) *jetstream.ConsumerInfo {
	t.Helper()
	shard := protocol.Shard("p", b.agent.Config().ID, testShards)
	c, err := b.js.Consumer(context.Background(), protocol.TaskStream(shard), b.agent.Config().ID)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func (b *bundle) presence(t *testing.T) (protocol.Presence, error) {
	t.Helper()
	kv, err := b.js.KeyValue(context.Background(), protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(context.Background(), protocol.PresenceKey("p", b.agent.Config().ID))
	if err != nil {
		return protocol.Presence{}, err
	}
	var p protocol.Presence
	if err := json.Unmarshal(e.Value(), &p); err != nil {
		t.Fatal(err)
	}
	return p, nil
}

// deadLetter returns the agent's last dead letter, if any.
func (b *bundle) deadLetter(t *testing.T) (*jetstream.RawStreamMsg, error) {
	t.Helper()
	s, err := b.js.Stream(context.Background(), protocol.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	return s.GetLastMsgForSubject(context.Background(), protocol.DLQSubject("p", b.agent.Config().ID))
}

// testLogger logs to the test. Every test agent gets one: the default,
// logging.New, writes zerolog globals and races with running agents.
func testLogger(t *testing.T) agent.Option {
	return agent.WithLogger(zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel))
}

// preconsumed sets up an agent's task consumer before the agent runs, as a
// crashed run would have left it, and a bundle that publishes to the
// agent's task subject through a stand-in of the same config. The caller
// takes deliveries from cons as that earlier run did, then starts the
// real agent with b.start(t, cfg, …).
func preconsumed(t *testing.T, id string) (b *bundle, cfg agent.Config, cons jetstream.Consumer) {
	t.Helper()
	srv, nc, js := natstest.Start(t, streams.Options{TaskShards: testShards, PresenceTTL: time.Second})
	cfg = testConfig(id)
	cfg.Lease = protocol.Duration(time.Second)
	full := cfg.WithDefaults()
	shard := protocol.Shard(full.Pool, full.ID, testShards)
	cc, err := streams.TaskConsumer(shard, full.Pool, full.ID, full.Lease.Std(), full.MaxDeliver, full.MaxConcurrent)
	if err != nil {
		t.Fatal(err)
	}
	cons, err = js.CreateOrUpdateConsumer(context.Background(), protocol.TaskStream(shard), cc)
	if err != nil {
		t.Fatal(err)
	}
	standIn, err := agent.New(cfg, agent.WithConn(nc))
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{srv: srv, nc: nc, js: js, agent: standIn}, cfg, cons
}

// labeledGoroutines runs start with a pprof label unique to t, which every
// goroutine start starts inherits, and every goroutine those start: it
// returns a count of them still alive and their stacks. Goroutines of the
// connection and server a test set up before are not counted, nor those
// of other tests running in parallel.
func labeledGoroutines(t *testing.T, start func()) func() (int, string) {
	t.Helper()
	const key = "warden_test"
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels(key, t.Name())))
	defer pprof.SetGoroutineLabels(context.Background())
	start()
	want := fmt.Sprintf("%q:%q", key, t.Name())
	return func() (int, string) {
		var buf bytes.Buffer
		if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
			t.Fatalf("goroutine profile: %v", err)
		}
		n, stacks := 0, ""
		for _, group := range strings.Split(buf.String(), "\n\n") {
			// "<count> @ <pcs>", "# labels: {...}", then the stack.
			lines := strings.SplitN(group, "\n", 3)
			if len(lines) < 2 || !strings.HasPrefix(lines[1], "# labels: ") || !strings.Contains(lines[1], want) {
				continue
			}
			c, err := strconv.Atoi(strings.Fields(lines[0])[0])
			if err != nil {
				t.Fatalf("goroutine profile: %q: %v", lines[0], err)
			}
			n += c
			stacks += group + "\n\n"
		}
		return n, stacks
	}
}

// noGoroutinesLeft waits for alive (labeledGoroutines) to count none.
func noGoroutinesLeft(t *testing.T, timeout time.Duration, alive func() (int, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		n, stacks := alive()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines of the agent still running %s after Run returned:\n%s", n, timeout, stacks)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// runEnds waits for Run to return and returns its error.
func (b *bundle) runEnds(t *testing.T, timeout time.Duration, why string) error {
	t.Helper()
	select {
	case err := <-b.done:
		b.done <- err // let the cleanup see it too
		return err
	case <-time.After(timeout):
		t.Fatalf("Run still running %s after %s", timeout, why)
		return nil
	}
}

package agenttest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/internal/testhook"
	"github.com/wardenhq/warden/pkg/protocol"
)

// ErrDrop, returned by a Script, hands the task back unreported: what an
// agent that crashed mid-task does to the step, but at once rather than
// after its lease. The delivery counts towards the consumer's max_deliver.
// Only an agent StartAgent runs does so: returned by the handler of any
// other agent, ErrDrop is an ordinary failure, reported.
var ErrDrop = testhook.ErrDrop

// Script decides what a scripted agent does with each task, as a handler
// does: return an output to succeed, an error to fail (agent.Permanent,
// agent.Retriable, agent.RetryAfter or a plain error), ErrDrop to hand the
// task back unreported, or block to hold the task (the runtime keeps its
// lease alive until the step's deadline, as for any handler).
type Script func(ctx context.Context, t *agent.Task) (any, error)

// Agent is a real agent — package agent's runtime on its own NATS
// connection, with a consumer, presence and control subject like any
// other — whose handler the test scripts. It is for tests of what
// schedulers, supervisors and tools do with agents that succeed, fail,
// hold or drop a task, crash, or look unhealthy. There is no second
// implementation of the agent protocol here: only the handler is scripted.
type Agent struct {
	nc   *nats.Conn // the test's: used after a crash (Leave)
	own  *nats.Conn // the agent's: closing it is the crash
	cfg  agent.Config
	rt   *agent.Agent
	stop func()

	stopped chan struct{} // closed by Stop: held scripts give up
	once    sync.Once
	done    chan struct{} // closed when Run returned

	mu       sync.Mutex
	script   Script
	received []protocol.Task
	orders   []string
	counts   *[2]uint64 // succeeded, failed reported instead of the real ones
}

// StartAgent runs a scripted agent until Stop, Leave or the end of the
// test, and returns once it is ready (consuming and announced). nc says
// where the server is: the agent opens its own connection with nc's
// options. Every action in cfg.Actions runs the script; with none listed
// the agent offers "echo". Until Script is called the agent succeeds,
// echoing the task's params as its output. Other fields of cfg keep the
// runtime's defaults, except LogLevel, which follows `go test -v`.
func StartAgent(tb testing.TB, nc *nats.Conn, cfg agent.Config) *Agent {
	tb.Helper()
	if len(cfg.Actions) == 0 {
		cfg.Actions = []string{"echo"}
	}
	opts := nc.Opts
	opts.Name = "agenttest " + cfg.Pool + "." + cfg.ID
	own, err := opts.Connect()
	if err != nil {
		tb.Fatalf("agenttest: connect: %v", err)
	}
	a := &Agent{nc: nc, own: own, stopped: make(chan struct{}), done: make(chan struct{})}
	log := zerolog.Nop()
	if testing.Verbose() {
		log = zerolog.New(zerolog.NewTestWriter(tb)).Level(zerolog.InfoLevel)
	}
	hooks := &testhook.Hooks{Presence: a.editPresence}
	rt, err := agent.New(cfg, agent.WithConn(own), agent.WithLogger(log), testhook.Option(hooks).(agent.Option))
	if err != nil {
		own.Close()
		tb.Fatalf("agenttest: %v", err)
	}
	a.rt, a.cfg = rt, rt.Config()
	for _, action := range cfg.Actions {
		rt.Handle(action, a.handle)
	}
	// Orders are recorded by a second subscriber that does not answer:
	// the runtime answers and obeys them.
	sub, err := own.Subscribe(protocol.AgentControlSubject(a.cfg.Pool, a.cfg.ID), func(m *nats.Msg) {
		var c protocol.Control
		_ = json.Unmarshal(m.Data, &c)
		a.mu.Lock()
		a.orders = append(a.orders, c.Op)
		a.mu.Unlock()
	})
	if err != nil {
		own.Close()
		tb.Fatalf("agenttest: subscribe control: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.stop = cancel
	runErr := make(chan error, 1)
	go func() {
		defer close(a.done)
		runErr <- rt.Run(ctx)
	}()
	tb.Cleanup(a.Stop)
	select {
	case <-rt.Ready():
		// Ready does not wait for the server to register the control
		// subscription; a round trip on the same connection does.
		if err := own.FlushTimeout(10 * time.Second); err != nil {
			tb.Fatalf("agenttest: flush: %v", err)
		}
	case err := <-runErr:
		_ = sub.Unsubscribe()
		tb.Fatalf("agenttest: agent %s did not start: %v", a.cfg.ID, err)
	case <-time.After(30 * time.Second):
		tb.Fatalf("agenttest: agent %s not ready after 30s", a.cfg.ID)
	}
	return a
}

// handle runs the script for every action.
func (a *Agent) handle(ctx context.Context, t *agent.Task) (any, error) {
	a.mu.Lock()
	a.received = append(a.received, t.Task)
	script := a.script
	a.mu.Unlock()
	if script == nil {
		script = echo
	}
	type outcome struct {
		out any
		err error
	}
	res := make(chan outcome, 1)
	// The script may ignore ctx; after a crash it is left behind, as a
	// crashed process leaves its work.
	go func() {
		out, err := script(ctx, t)
		res <- outcome{out, err}
	}()
	select {
	case o := <-res:
		select {
		case <-a.stopped:
			return nil, ErrDrop // crashed meanwhile: nothing is reported
		default:
		}
		return o.out, o.err
	case <-a.stopped:
		return nil, ErrDrop
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func echo(_ context.Context, t *agent.Task) (any, error) {
	if len(t.Params) == 0 {
		return nil, nil
	}
	return t.Params, nil
}

func (a *Agent) editPresence(p *protocol.Presence) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.counts != nil {
		p.Succeeded, p.Failed = a.counts[0], a.counts[1]
	}
}

// Script sets what the agent does with the next tasks; nil succeeds,
// echoing the params.
func (a *Agent) Script(s Script) {
	a.mu.Lock()
	a.script = s
	a.mu.Unlock()
}

// Received returns the tasks the script was called for, in order.
func (a *Agent) Received() []protocol.Task {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]protocol.Task(nil), a.received...)
}

// Orders returns the ops of the control messages received so far
// (protocol.ControlDrain, ...), in order. The runtime obeys them.
func (a *Agent) Orders() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.orders...)
}

// Report makes the next heartbeats carry these cumulative counters instead
// of the real ones, so that the agent looks as healthy or sick as the test
// needs.
func (a *Agent) Report(succeeded, failed uint64) {
	a.mu.Lock()
	a.counts = &[2]uint64{succeeded, failed}
	a.mu.Unlock()
}

// Runtime is the agent runtime being scripted (its Config, Stats, ...).
func (a *Agent) Runtime() *agent.Agent { return a.rt }

// Stop crashes the agent: its connection closes, so nothing more is
// published — no heartbeat, result, ack or hand-back — and its presence
// expires with the bucket's TTL; tasks it held come back after their
// lease. Stop returns once the runtime has stopped. It is called at the
// end of the test; calling it again does nothing.
func (a *Agent) Stop() {
	a.once.Do(func() {
		a.own.Close()
		close(a.stopped)
		a.stop()
		<-a.done
	})
}

// Leave crashes the agent (Stop) and deletes its presence key at once, as
// if it had shut down cleanly without handing back the tasks it held.
func (a *Agent) Leave() {
	a.Stop()
	js, err := jetstream.New(a.nc)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if kv, err := js.KeyValue(ctx, protocol.BucketPresence); err == nil {
		_ = kv.Delete(ctx, protocol.PresenceKey(a.cfg.Pool, a.cfg.ID))
	}
}

// PublishResult publishes r as agent r.Agent of pool r.Pool would
// (agent.ResultMsg), e.g. a late or forged result for a fencing test. Its
// Nats-Msg-Id also carries the status and finish time, so that a second
// result for the same dispatch is not deduplicated away.
func PublishResult(ctx context.Context, js jetstream.JetStream, r protocol.Result) error {
	m, err := agent.ResultMsg(r)
	if err != nil {
		return err
	}
	m.Header.Set(protocol.HeaderMsgID, fmt.Sprintf("%s.%s.%d", m.Header.Get(protocol.HeaderMsgID), r.Status, r.FinishedAt.UnixNano()))
	_, err = js.PublishMsg(ctx, m)
	return err
}

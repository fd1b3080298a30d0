package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
)

// control sends one control request to the test agent and returns its reply.
func (b *bundle) control(t *testing.T, c protocol.Control) protocol.Reply {
	t.Helper()
	body, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	m, err := b.nc.Request(protocol.AgentControlSubject("p", b.agent.Config().ID), body, 5*time.Second)
	if err != nil {
		t.Fatalf("control %s: %v", c.Op, err)
	}
	var r protocol.Reply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatalf("control %s reply %q: %v", c.Op, m.Data, err)
	}
	return r
}

// holdsFor fails the test if cond turns false within d. It checks that
// something does not happen: the old code did it within milliseconds.
func holdsFor(t *testing.T, d time.Duration, msg string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if !cond() {
			t.Fatalf("%s: no longer true", msg)
		}
	}
}

// blocker is a handler that runs until released, saying when it started.
// Tests defer free after setup, so that it runs before the agent's cleanup
// waits for its tasks.
type blocker struct {
	started chan struct{}
	release chan struct{}
	once    sync.Once
}

func newBlocker() *blocker {
	return &blocker{started: make(chan struct{}, 8), release: make(chan struct{})}
}

func (b *blocker) free() { b.once.Do(func() { close(b.release) }) }

func (b *blocker) handle(context.Context, *agent.Task) (any, error) {
	b.started <- struct{}{}
	<-b.release
	return "done", nil
}

func (b *blocker) waitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-b.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the blocking task did not start")
	}
}

// busyAgent starts an agent of max slots running one task that blocks
// (j1/s, action long) until free, and counts the runs of action other.
// Callers defer long.free() (see blocker).
func busyAgent(t *testing.T, max int, other string) (b *bundle, long *blocker, ran *atomic.Int32) {
	t.Helper()
	cfg := testConfig("a1")
	cfg.MaxConcurrent = max
	long, ran = newBlocker(), new(atomic.Int32)
	b = setup(t, cfg, func(a *agent.Agent) {
		a.Handle("long", long.handle)
		a.Handle(other, func(context.Context, *agent.Task) (any, error) { ran.Add(1); return "ran", nil })
	})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s", Action: "long"})
	long.waitStarted(t)
	return b, long, ran
}

// A drain that arrives while every slot is busy holds: the dispatcher was
// already waiting for a slot when it came, and used to pull as soon as one
// freed, so the agents the supervisor drains (overloaded, unhealthy) took
// new work all the same.
func TestDrainWhileEverySlotIsBusyTakesNothingNew(t *testing.T) {
	t.Parallel()
	b, long, ran := busyAgent(t, 1, "next")
	defer long.free()
	if r := b.control(t, protocol.Control{Op: protocol.ControlDrain}); !r.OK {
		t.Fatalf("drain: %+v", r)
	}
	b.publish(t, protocol.Task{JobID: "j2", StepID: "s", Action: "next"})
	long.free()
	if r, _ := b.result(t, "j1", "s"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("in-flight task: %+v", r)
	}
	natstest.Eventually(t, 10*time.Second, "the in-flight task acked", func() bool { return b.consumerInfo(t).NumAckPending == 0 })
	holdsFor(t, time.Second, "a drained agent takes no task", func() bool {
		return ran.Load() == 0 && b.consumerInfo(t).NumAckPending == 0
	})
	if r := b.control(t, protocol.Control{Op: protocol.ControlUndrain}); !r.OK {
		t.Fatalf("undrain: %+v", r)
	}
	if r, _ := b.result(t, "j2", "s"); r.Status != protocol.ResultSucceeded || ran.Load() != 1 {
		t.Fatalf("after undrain: %+v, ran %d", r, ran.Load())
	}
}

// The same for a limit lowered while every slot is busy: 2 of 2 running,
// the limit set to 1, one finishes; nothing new starts until the other
// does too.
func TestLimitLoweredWhileEverySlotIsBusyHolds(t *testing.T) {
	t.Parallel()
	cfg := testConfig("a1")
	cfg.MaxConcurrent = 2
	first, second := newBlocker(), newBlocker()
	var ran atomic.Int32
	b := setup(t, cfg, func(a *agent.Agent) {
		a.Handle("first", first.handle)
		a.Handle("second", second.handle)
		a.Handle("next", func(context.Context, *agent.Task) (any, error) { ran.Add(1); return "ran", nil })
	})
	defer first.free()
	defer second.free()
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s", Action: "first"})
	b.publish(t, protocol.Task{JobID: "j2", StepID: "s", Action: "second"})
	first.waitStarted(t)
	second.waitStarted(t)
	if r := b.control(t, protocol.Control{Op: protocol.ControlLimit, Value: 1}); !r.OK {
		t.Fatalf("limit: %+v", r)
	}
	b.publish(t, protocol.Task{JobID: "j3", StepID: "s", Action: "next"})
	first.free()
	b.result(t, "j1", "s")
	holdsFor(t, time.Second, "one task runs under a limit of one", func() bool { return ran.Load() == 0 })
	second.free()
	if r, _ := b.result(t, "j3", "s"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("after the limit allowed it: %+v", r)
	}
}

// A lowered limit is what the heartbeat reports as max_concurrent, so that
// selection counts the slots the agent uses; it used to report the
// configured number and keep a full share of tasks coming.
func TestHeartbeatReportsTheLimitInForce(t *testing.T) {
	t.Parallel()
	cfg := testConfig("a1")
	cfg.MaxConcurrent = 4
	b := setup(t, cfg, nil)
	natstest.Eventually(t, 5*time.Second, "a heartbeat with max_concurrent 4", func() bool {
		p, err := b.presence(t)
		return err == nil && p.MaxConcurrent == 4
	})
	if r := b.control(t, protocol.Control{Op: protocol.ControlLimit, Value: 1}); !r.OK {
		t.Fatalf("limit: %+v", r)
	}
	natstest.Eventually(t, 5*time.Second, "a heartbeat with max_concurrent 1", func() bool {
		p, err := b.presence(t)
		return err == nil && p.MaxConcurrent == 1
	})
}

// A step cancelled while it waits to run (a suspect waiting to run alone)
// ends cancelled, unrun. It used to be handed back, and its redelivery,
// carrying no cancel, ran.
func TestCancelWhileWaitingToRunReportsCancelledUnrun(t *testing.T) {
	t.Parallel()
	b, long, ran := busyAgent(t, 2, "victim")
	defer long.free()
	m := b.taskMsg(t, protocol.Task{JobID: "j2", StepID: "s", Action: "victim"})
	m.Header.Set(protocol.HeaderRecoveries, "1") // a suspect: it waits to run alone
	if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	// Sent once the agent has it in hand (a cancel sent before is kept
	// and applied when it arrives: TestCancelOfAQueuedDispatchHoldsWhenItArrives).
	natstest.Eventually(t, 10*time.Second, "the step in hand, waiting", func() bool {
		return b.consumerInfo(t).NumAckPending == 2
	})
	// Answered ok, or, if the order came before the run registered it,
	// not_found and kept: either way it is reported cancelled unrun.
	if rep := b.control(t, protocol.Control{Op: protocol.ControlCancel, JobID: "j2", StepID: "s", Epoch: 1}); !rep.OK &&
		(rep.Error == nil || rep.Error.Code != protocol.CodeNotFound) {
		t.Fatalf("cancel of the waiting step: %+v", rep)
	}
	r, _ := b.result(t, "j2", "s")
	if r.Status != protocol.ResultFailed || !strings.HasPrefix(r.Error, protocol.ErrorCancelled) || ran.Load() != 0 {
		t.Fatalf("cancelled while waiting: %+v, handler ran %d times", r, ran.Load())
	}
}

// A suspect whose step timeout passed while it waited to run alone is not
// started; its result says the timeout passed. Its handler used to be
// called with a context already ended, and one that did not look ran. It
// is reported when its timeout passes, while the long task still runs
// (TestSuspectWaitingPastItsDeadlineIsReported).
func TestHandlerWhoseTimeoutPassedWhileWaitingIsNotStarted(t *testing.T) {
	t.Parallel()
	b, long, ran := busyAgent(t, 2, "victim")
	defer long.free()
	m := b.taskMsg(t, protocol.Task{JobID: "j2", StepID: "s", Action: "victim", Timeout: protocol.Duration(300 * time.Millisecond)})
	m.Header.Set(protocol.HeaderRecoveries, "1")
	if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	r, _ := b.result(t, "j2", "s")
	if r.Status != protocol.ResultFailed || !strings.Contains(r.Error, agent.ErrDeadline.Error()) || ran.Load() != 0 {
		t.Fatalf("timed out while waiting: %+v, handler ran %d times", r, ran.Load())
	}
}

// A handler that returns its own error once its deadline has ended is
// reported as having reached it, as the built-in actions are: retries
// classify the step by that. The wrap was made against the outer context,
// which never carries the deadline, and never applied.
func TestHandlerErrorAfterItsDeadlineSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t, testConfig("a1"), func(a *agent.Agent) {
		a.Handle("custom", func(ctx context.Context, _ *agent.Task) (any, error) {
			<-ctx.Done()
			return nil, errors.New("gave up")
		})
	})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s", Action: "custom", Timeout: protocol.Duration(200 * time.Millisecond)})
	r, _ := b.result(t, "j1", "s")
	if r.Status != protocol.ResultFailed || !strings.Contains(r.Error, agent.ErrDeadline.Error()) || !strings.Contains(r.Error, "gave up") {
		t.Fatalf("result: %+v", r)
	}
}

// An order is answered only on an inbox (protocol.ValidReplySubject): the
// answer goes out with the agent's permissions, and the reply subject is
// the requester's choice. An order naming another subject is dropped,
// unobeyed (a consumer's deliveries carry a $JS.ACK. reply); one with no
// reply at all, as the scheduler's cancel orders, is obeyed.
func TestControlAnsweredOnlyOnAnInbox(t *testing.T) {
	t.Parallel()
	b := setup(t, testConfig("a1"), nil)
	forged := "$KV." + protocol.BucketPresence + "." + protocol.PresenceKey("p", "a2")
	answers, err := b.nc.SubscribeSync(forged)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(protocol.Control{Op: protocol.ControlDrain})
	if err := b.nc.PublishMsg(&nats.Msg{Subject: protocol.AgentControlSubject("p", "a1"), Reply: forged, Data: body}); err != nil {
		t.Fatal(err)
	}
	// Orders are handled in turn: once this one is answered, the forged
	// one was handled.
	if r := b.control(t, protocol.Control{Op: protocol.ControlLimit}); !r.OK {
		t.Fatalf("limit 0 (max_concurrent): %+v", r)
	}
	if m, err := answers.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatalf("answered on %s: %s", forged, m.Data)
	}
	holdsFor(t, time.Second, "an order with a forged reply subject is not obeyed", func() bool {
		p, err := b.presence(t)
		return err == nil && !p.Draining
	})
	if err := b.nc.Publish(protocol.AgentControlSubject("p", "a1"), body); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "an order without a reply is obeyed", func() bool {
		p, err := b.presence(t)
		return err == nil && p.Draining
	})
}

// A cancel order that names no task (no job, step or epoch) is refused.
// It was kept as an early cancel under the key "..0", taking one of the
// 1,024 places of kept cancels and matching no task: a burst of them
// pushed the genuine ones out. (Found by a reviewer.)
//
// Old code: "cancel {Op:cancel JobID: StepID: Epoch:0 …} answered
// not_found: step . at epoch 0 is not running here, want invalid_request".
func TestCancelNamingNoTaskIsRefused(t *testing.T) {
	t.Parallel()
	cfg := testConfig("a1")
	b := setup(t, cfg, nil)
	for _, c := range []protocol.Control{
		{Op: protocol.ControlCancel},
		{Op: protocol.ControlCancel, JobID: "j", StepID: "s"},
		{Op: protocol.ControlCancel, JobID: "j.x", StepID: "s", Epoch: 1},
	} {
		r := b.control(t, c)
		if r.OK || r.Error == nil || r.Error.Code != protocol.CodeInvalidRequest {
			t.Errorf("cancel %+v answered %+v, want invalid_request", c, r.Error)
		}
	}
	if r := b.control(t, protocol.Control{Op: protocol.ControlCancel, JobID: "j", StepID: "s", Epoch: 1}); r.Error == nil || r.Error.Code != protocol.CodeNotFound {
		t.Errorf("cancel of a task not here answered %+v, want not_found", r.Error)
	}
}

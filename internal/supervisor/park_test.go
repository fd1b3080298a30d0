package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// inStepWrite reports whether the fence being checked (a hookLease's hook
// runs inside it) is the one of a step write, term.updateStep: in a park,
// the CAS that marks the step dead-lettered. The hooks below interrupt a
// park there, whatever the order of its other side effects.
func inStepWrite() bool { return inTermCall("updateStep") }

// inTermCall reports whether the fence being checked is the one of the
// term's method name.
func inTermCall(name string) bool {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, ".(*term)."+name) {
			return true
		}
		if !more {
			return false
		}
	}
}

// interruptAtMark hooks p's term so that every park's CAS fails: "fence"
// refuses the first one (the lease is not sure for a moment), "conflicts"
// renews job's step under each (still dispatched, same epoch), so every
// CAS is lost. unhook ends it.
func interruptAtMark(t *testing.T, p *parts, how, job string) (unhook func()) {
	var n atomic.Int64
	h := p.hooked()
	h.hook = func() bool {
		if !inStepWrite() {
			return false
		}
		if how == "fence" {
			return n.Add(1) == 1
		}
		p.renew(t, job)
		return false
	}
	return func() { h.hook = nil }
}

// advisoryMsg is an advisory as the advisory consumer hands it over.
type advisoryMsg struct {
	jetstream.Msg
	data []byte
}

func (m advisoryMsg) Data() []byte { return m.data }

// consume creates agent's task consumer with maxDeliver and hands out
// deliveries of its queued task, each not acked: maxDeliver deliveries
// exhaust it, as a task that crashes its agent every time; fewer leave it
// in flight.
func (p *parts) consume(t *testing.T, agent string, maxDeliver, deliveries int) {
	t.Helper()
	ctx := context.Background()
	q, _ := agentQueue("default", agent, streams.DefaultTaskShards)
	cc, err := streams.TaskConsumer(q.shard, q.pool, q.agent, time.Minute, maxDeliver, 4)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := p.js.CreateOrUpdateConsumer(ctx, q.stream, cc)
	if err != nil {
		t.Fatal(err)
	}
	for range deliveries {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if deliveries == maxDeliver {
			_ = m.Nak()
		}
	}
	if deliveries == maxDeliver {
		natstest.Eventually(t, 10*time.Second, "the server to give the task up", func() bool {
			_, _ = cons.Next(jetstream.FetchMaxWait(100 * time.Millisecond))
			info, err := cons.Info(ctx)
			return err == nil && info.NumAckPending == 0 && info.NumRedelivered > 0
		})
	}
}

// queueTask queues a task of job's step s at epoch in agent's queue.
func (p *parts) queueTask(t *testing.T, job, agent string, epoch int) {
	t.Helper()
	q, _ := agentQueue("default", agent, streams.DefaultTaskShards)
	m := nats.NewMsg(q.subject)
	m.Data = []byte(`{}`)
	m.Header.Set(protocol.HeaderJob, job)
	m.Header.Set(protocol.HeaderStep, "s")
	m.Header.Set(protocol.HeaderEpoch, strconv.Itoa(epoch))
	if _, err := p.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// parkedOnce fails t unless job's step s is dead-lettered at epoch 1 with
// one dead letter stored and its task gone from queue.
func parkedOnce(t *testing.T, p *parts, what, job string, queue jetstream.Stream, seq uint64) {
	t.Helper()
	st, _, err := p.store.Step(context.Background(), job, "s")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != jobstore.StepDeadLettered || st.Epoch != 1 || !taskGone(t, queue, seq) || p.msgs(t, protocol.StreamDLQ) != 1 {
		t.Errorf("%s: step %s at epoch %d (recoveries %d); task gone %v; %d dead letters; want dead_lettered at 1, gone, 1",
			what, st.State, st.Epoch, st.Recoveries, taskGone(t, queue, seq), p.msgs(t, protocol.StreamDLQ))
	}
}

// A park stored its letter, deleted the task, and only then marked the
// step dead_lettered. Interrupted at the mark (the fence said "not the
// leader", or the CAS was lost maxConflicts times), exhausted returned an
// error and the advisory was handled again; confirm then found the task
// gone ("acked after all") and the advisory was acked: the step stayed
// dispatched at its epoch, never parked, its poison sent again after its
// lease, and the DLQ held a letter for a step that was not dead-lettered.
// The CAS is now the park's commit point and the task is deleted after it:
// handled again, the advisory finds the task and parks the step, with the
// letter stored the first time.
//
// Old code, both cases: "the park deleted the task but did not mark its
// step" and "advisory handled again: step dispatched at epoch 1
// (recoveries 0); task gone true; 1 dead letters; want dead_lettered at 1,
// gone, 1".
func TestParkInterruptedAtItsMarkParksWhenHandledAgain(t *testing.T) {
	interruptedThenRetried(t, "advisory handled again", func(t *testing.T, p *parts, job string) (jetstream.Stream, uint64, func() error) {
		queue, seq, raw := p.dispatchedTask(t, job, "a1")
		p.consume(t, "a1", 2, 2)
		adv := maxDeliver(queue, "a1", seq)
		b, err := json.Marshal(adv)
		if err != nil {
			t.Fatal(err)
		}
		first := true
		return queue, seq, func() error {
			if first {
				first = false
				return p.rel.dead.exhausted(context.Background(), adv, raw)
			}
			return p.rel.dead.handle(context.Background(), advisoryMsg{data: b})
		}
	})
}

// interruptedThenRetried runs, for a park interrupted at its mark both
// ways (the fence refuses; the CAS is lost every time), the action prepare
// returns: once interrupted, when it must fail and leave the task in its
// queue, and once more unhindered, when it must park the step once.
func interruptedThenRetried(t *testing.T, again string, prepare func(t *testing.T, p *parts, job string) (queue jetstream.Stream, seq uint64, act func() error)) {
	t.Helper()
	t.Parallel()
	for _, how := range []string{"fence", "conflicts"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			p := newParts(t)
			job := "job-" + how
			queue, seq, act := prepare(t, p, job)
			unhook := interruptAtMark(t, p, how, job)
			if err := act(); err == nil {
				t.Fatal("the park was not interrupted")
			}
			unhook()
			if taskGone(t, queue, seq) {
				t.Errorf("the park deleted the task but did not mark its step")
			}
			if err := act(); err != nil {
				t.Fatalf("%s: %v", again, err)
			}
			parkedOnce(t, p, again, job, queue, seq)
		})
	}
}

// The same in a failover: a poison park of a task the departed agent had
// in hand, interrupted at its mark, had deleted the task; the failover,
// tried again, found the queue empty, and the step stayed dispatched until
// its lease. The retried failover now parks it.
//
// Old code, both cases: "the park deleted the task but did not mark its
// step" and "failover tried again: step dispatched at epoch 1 (recoveries
// 2); task gone true; 1 dead letters; ...".
func TestPoisonParkInterruptedInAFailoverParksWhenRetried(t *testing.T) {
	interruptedThenRetried(t, "failover tried again", func(t *testing.T, p *parts, job string) (jetstream.Stream, uint64, func() error) {
		queue, seq, _ := p.poisonedTask(t, job, "a2")
		p.consume(t, "a2", 5, 1) // in its hands when it departed
		return queue, seq, func() error {
			_, err := p.fo.transfer(context.Background(), "default", "a2", "departed:x")
			return err
		}
	})
}

// And in the cluster transfer policy: a give-up (max_transfer_retries
// spent) interrupted at its mark had deleted the task, and the next
// judgement took the missing task for "the member had it": TransferDone,
// the step left dispatched, the policy's dead-lettering skipped. Judged
// again, the step is now given up.
//
// Old code, both cases: "the park deleted the task but did not mark its
// step" and "judged again: step dispatched at epoch 1 (recoveries 0); task
// gone true; 1 dead letters; ...".
func TestTransferGiveUpInterruptedAtItsMarkGivesUpWhenJudgedAgain(t *testing.T) {
	interruptedThenRetried(t, "judged again", func(t *testing.T, p *parts, job string) (jetstream.Stream, uint64, func() error) {
		queue, seq, _ := p.dispatchedTask(t, job, "a3")
		x := newTransfers(p.term, p.js, p.store, p.rel, p.rel.dead, p.adv, NewMetrics(nil), streams.DefaultTaskShards, time.Second, p.rel.log)
		w := &transferWatch{transferNote: transferNote{job: job, step: "s", cluster: "c1", from: "default.a0"},
			policy: cluster.TransferPolicy{Timeout: time.Second, MaxRetries: 1}, retries: 1}
		first := true
		return queue, seq, func() error {
			keep, err := x.judge(context.Background(), w)
			if !first && err == nil && keep {
				return errors.New("the step is still watched") // judged again, it must be given up
			}
			first = false
			return err
		}
	})
}

// A healing transfer (after the drain timeout, or on "failed" health) and
// an operator's failover move the queue of an agent that is present. Every
// task it had in hand counted as a suspect recovery, as if it had crashed
// the agent: a long step moved off three drained agents was dead-lettered
// as poison though nothing crashed. Only departures (and lease expiries)
// count now.
//
// Old code: "healing transfer off live agent a1: step pending, 1
// recoveries, want pending with 0" (then 2 for a2), "... a3: step
// dead_lettered, 2 recoveries ...", "operator failover of live agent a4:
// step pending, 1 recoveries ...".
func TestQueuesMovedOffLiveAgentsAreNoPoison(t *testing.T) {
	t.Parallel()
	p := newParts(t)
	ctx := context.Background()
	tr, err := health.NewTracker(health.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	h := &healer{term: p.term, failover: p.fo, assessor: &assessor{tracker: tr}, log: zerolog.Nop(), care: map[string]*agentCare{}}
	// dispatch moves job's step to agent (epoch n) with its task in hand.
	dispatch := func(job, agent string, n int) {
		t.Helper()
		if n > 1 {
			p.changeStep(t, job, func(st *jobstore.Step) error {
				return st.Dispatch(agent, protocol.NewLeaseToken(), time.Now().UTC(), time.Minute)
			})
			p.queueTask(t, job, agent, n)
		} else {
			p.dispatched(t, job, agent)
		}
		p.consume(t, agent, 5, 1)
	}
	check := func(job, what string) {
		t.Helper()
		st, _, err := p.store.Step(ctx, job, "s")
		if err != nil {
			t.Fatal(err)
		}
		if st.State != jobstore.StepPending || st.Recoveries != 0 {
			t.Errorf("%s: step %s, %d recoveries, want pending with 0", what, st.State, st.Recoveries)
		}
	}
	for i, agent := range []string{"a1", "a2", "a3"} {
		dispatch("job-l", agent, i+1)
		h.transfer(ctx, protocol.Presence{Pool: "default", ID: agent, HeartbeatAt: time.Now()}, "drain timeout passed")
		check("job-l", "healing transfer off live agent "+agent)
	}

	// An operator's failover of a present agent.
	view, err := presence.NewView(ctx, p.js, zerolog.Nop(), presence.WithTaskShards(streams.DefaultTaskShards))
	if err != nil {
		t.Fatal(err)
	}
	pkv, err := p.js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pkv.Put(ctx, protocol.PresenceKey("default", "a4"), []byte(`{"id":"a4","pool":"default"}`)); err != nil {
		t.Fatal(err)
	}
	l := &leader{term: p.term, view: view, failover: p.fo, log: zerolog.Nop(),
		suspects: &suspects{f: p.fo, view: view, presence: pkv, log: zerolog.Nop()}}
	sub, err := p.nc.Subscribe(protocol.SubjectControlFailover, func(m *nats.Msg) { l.manualFailover(ctx, m) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	dispatch("job-o", "a4", 1)
	if _, err := p.nc.Request(protocol.SubjectControlFailover, []byte("default.a4"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	check("job-o", "operator failover of live agent a4")
	if n := p.msgs(t, protocol.StreamDLQ); n != 0 {
		t.Errorf("%d dead letters for steps that never crashed an agent", n)
	}

	// A departure with the task in hand still counts.
	dispatch("job-d", "a5", 1)
	if _, err := p.fo.transfer(ctx, "default", "a5", "departed:x"); err != nil {
		t.Fatal(err)
	}
	if st, _, err := p.store.Step(ctx, "job-d", "s"); err != nil || st.State != jobstore.StepPending || st.Recoveries != 1 {
		t.Fatalf("after a departure: %+v %v, want pending with 1 recovery", st, err)
	}
	// So does an operator's failover of an agent that is gone already.
	dispatch("job-g", "a6", 1)
	if _, err := p.nc.Request(protocol.SubjectControlFailover, []byte("default.a6"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if st, _, err := p.store.Step(ctx, "job-g", "s"); err != nil || st.State != jobstore.StepPending || st.Recoveries != 1 {
		t.Fatalf("after an operator's failover of a departed agent: %+v %v, want pending with 1 recovery", st, err)
	}
}

// A task of a job being cancelled that exhausts its deliveries: the
// releaser and the transfer give-up honour "cancel wins", exhausted parked
// it, and the job failed dead-lettered with a DLQ letter nobody wanted.
// The step now ends cancelled, without a letter, its task deleted, and a
// scheduler is asked to advance the job (which then ends cancelled).
//
// Old code: "step dead_lettered (desired succeeded), 1 dead letters, task
// gone true, 1 advance requests; want cancelled, 0, true, >0".
func TestExhaustedTaskOfACancelledJobEndsCancelled(t *testing.T) {
	t.Parallel()
	p := newParts(t)
	ctx := context.Background()
	queue, seq, raw := p.dispatchedTask(t, "job-c", "a1")
	j, rev, err := p.store.Job(ctx, "job-c")
	if err != nil {
		t.Fatal(err)
	}
	j.Desired = jobstore.JobCancelled
	if _, err := p.store.UpdateJob(ctx, j, rev); err != nil {
		t.Fatal(err)
	}
	var asked atomic.Int32
	sub, err := p.nc.Subscribe(protocol.SubjectControlAdvance, func(m *nats.Msg) {
		if string(m.Data) == "job-c" {
			asked.Add(1)
		}
		_ = m.Respond(protocol.OKReply(""))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := p.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := p.rel.dead.exhausted(ctx, maxDeliver(queue, "a1", seq), raw); err != nil {
		t.Fatal(err)
	}
	st, _, err := p.store.Step(ctx, "job-c", "s")
	if err != nil {
		t.Fatal(err)
	}
	gone := taskGone(t, queue, seq)
	if st.State != jobstore.StepCancelled || p.msgs(t, protocol.StreamDLQ) != 0 || !gone || asked.Load() == 0 {
		t.Errorf("step %s (desired %s), %d dead letters, task gone %v, %d advance requests; want cancelled, 0, true, >0",
			st.State, st.Desired, p.msgs(t, protocol.StreamDLQ), gone, asked.Load())
	}
	if evs := p.msgs(t, protocol.StreamEvents); evs == 0 {
		t.Errorf("no step_cancelled event")
	}
}

// A park that marked its step and then could not delete the task (here the
// fence refuses the delete) is a park: the job is advanced, and the error
// has the advisory handled again, which finds the step moved on and
// deletes the task.
func TestParkThatKeptItsTaskDeletesItWhenHandledAgain(t *testing.T) {
	t.Parallel()
	p := newParts(t)
	ctx := context.Background()
	queue, seq, raw := p.dispatchedTask(t, "job-k", "a1")
	p.consume(t, "a1", 2, 2)
	asked := p.countAdvances(t)
	var refused atomic.Bool
	h := p.hooked()
	h.hook = func() bool { return inTermCall("deleteMsg") && !refused.Swap(true) }
	adv := maxDeliver(queue, "a1", seq)
	if err := p.rel.dead.exhausted(ctx, adv, raw); !errors.Is(err, errNotLeader) {
		t.Fatalf("exhausted: %v, want the delete's error (not the leader)", err)
	}
	h.hook = nil
	st, _, err := p.store.Step(ctx, "job-k", "s")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != jobstore.StepDeadLettered || taskGone(t, queue, seq) || asked.Load() == 0 {
		t.Fatalf("step %s, task gone %v, %d advance requests; want dead_lettered, kept, >0", st.State, taskGone(t, queue, seq), asked.Load())
	}
	b, err := json.Marshal(adv)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.rel.dead.handle(ctx, advisoryMsg{data: b}); err != nil {
		t.Fatalf("advisory handled again: %v", err)
	}
	parkedOnce(t, p, "advisory handled again", "job-k", queue, seq)
}

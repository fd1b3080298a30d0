package supervisor

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// hookLease is a test lease that runs hook at every fence check. Every
// side effect of a term is fenced right before it happens (term.go), so
// the hook sees the world between the steps of a park: after the letter's
// publish, after the task's delete, just before the CAS that marks the
// step. That is where these tests look at the order of things or change
// the step under the park's feet. The hook runs on the caller's goroutine;
// when it returns true, that one check answers "not the leader".
type hookLease struct {
	fakeLease
	hook func() (refuse bool)
}

func (h *hookLease) Leader() (uint64, bool) {
	if h.hook != nil && h.hook() {
		return 0, false
	}
	return h.fakeLease.Leader()
}

// hooked puts a hookLease in p's term (the same epoch) and returns it.
func (p *parts) hooked() *hookLease {
	h := &hookLease{}
	h.epoch.Store(p.lease.epoch.Load())
	p.term.lease = h
	return h
}

// letters returns the dead letters stored on subject, oldest first.
func (p *parts) letters(t *testing.T, subject string) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	s, err := p.js.Stream(ctx, protocol.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq != 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject == subject {
			out = append(out, m)
		}
	}
	return out
}

// taskGone reports whether message seq has left queue.
func taskGone(t *testing.T, queue jetstream.Stream, seq uint64) bool {
	t.Helper()
	_, err := queue.GetMsg(context.Background(), seq)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatal(err)
	}
	return err != nil
}

// task returns the task message seq of queue.
func task(t *testing.T, queue jetstream.Stream, seq uint64) *jetstream.RawStreamMsg {
	t.Helper()
	raw, err := queue.GetMsg(context.Background(), seq)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// dispatchedTask is dispatched, with the task it queued.
func (p *parts) dispatchedTask(t *testing.T, job, agent string) (jetstream.Stream, uint64, *jetstream.RawStreamMsg) {
	t.Helper()
	queue, seq := p.dispatched(t, job, agent)
	return queue, seq, task(t, queue, seq)
}

// poisonedTask is dispatchedTask for a step already taken back from its
// agents twice: the next release parks it (poison threshold 3).
func (p *parts) poisonedTask(t *testing.T, job, agent string) (jetstream.Stream, uint64, *jetstream.RawStreamMsg) {
	t.Helper()
	ctx := context.Background()
	queue, seq := p.dispatched(t, job, agent)
	st, rev, _ := p.store.Step(ctx, job, "s")
	st.Recoveries = 2
	if _, err := p.store.UpdateStep(ctx, st, rev); err != nil {
		t.Fatal(err)
	}
	return queue, seq, task(t, queue, seq)
}

// maxDeliver is the advisory that the task seq of queue was delivered 5
// times to agent without an ack.
func maxDeliver(queue jetstream.Stream, agent string, seq uint64) advisory {
	return advisory{Type: advisoryMaxDeliver, Stream: queue.CachedInfo().Config.Name, Consumer: agent, StreamSeq: seq, Deliveries: 5}
}

// changeStep applies change to job's step s and stores it, on the revision
// it read.
func (p *parts) changeStep(t *testing.T, job string, change func(st *jobstore.Step) error) {
	t.Helper()
	ctx := context.Background()
	st, rev, err := p.store.Step(ctx, job, "s")
	if err != nil {
		t.Fatal(err)
	}
	if err := change(st); err != nil {
		t.Fatal(err)
	}
	if _, err := p.store.UpdateStep(ctx, st, rev); err != nil {
		t.Fatal(err)
	}
}

// renew renews job's step s in place (still dispatched, same epoch).
func (p *parts) renew(t *testing.T, job string) {
	t.Helper()
	p.changeStep(t, job, func(st *jobstore.Step) error {
		st.LockedUntil = time.Now().Add(time.Minute)
		return nil
	})
}

// An agent may publish on its own dead-letter subject with any
// Nats-Msg-Id, and WARDEN_DLQ deduplicates by id across all its subjects.
// An agent that knew (or guessed) a step's job, step and epoch could
// publish "dlq.<job>.<step>.<epoch>.max_deliveries" first: the
// supervisor's genuine letter was then dropped as a duplicate, which
// copyToDLQ did not look at, and the task was deleted all the same, so the
// dead letter was lost (the step dead_lettered, no letter to retry from).
// Now a deduplicated letter counts as stored only if the stored message
// is this letter; otherwise it is published again under an id no agent
// can predict, before the task is deleted: on the letter's subject, with
// its headers and its body. A park retried (the advisory handled again
// after an error, the CAS lost) still stores the letter once.
//
// Old code: "task deleted while no genuine dead letter is stored" and
// "0 dead letters on warden.dlq.default.a1, want 1".
func TestForgedMessageIDDoesNotSuppressADeadLetter(t *testing.T) {
	t.Parallel()
	p := newParts(t)
	ctx := context.Background()
	queue, seq, raw := p.dispatchedTask(t, "job-f", "a1")
	genuine := protocol.DLQSubject("default", "a1")

	// The forger: agent "evil" on its own subject, with the id the
	// supervisor would use and headers that look like the letter's.
	fake := nats.NewMsg(protocol.DLQSubject("default", "evil"))
	fake.Data = []byte(`{"forged":true}`)
	fake.Header.Set(protocol.HeaderMsgID, "dlq.job-f.s.1."+string(protocol.DLQMaxDeliveries))
	fake.Header.Set(protocol.HeaderJob, "job-f")
	fake.Header.Set(protocol.HeaderStep, "s")
	fake.Header.Set(protocol.HeaderEpoch, "1")
	fake.Header.Set(protocol.HeaderDLQReason, string(protocol.DLQMaxDeliveries))
	fake.Header.Set(protocol.HeaderDLQDetail, "nothing to see")
	if _, err := p.js.PublishMsg(ctx, fake); err != nil {
		t.Fatal(err)
	}

	// At every side effect: once the task is gone, its letter is stored.
	// At the first CAS that marks the step (the letter stored), the lease
	// check fails: the advisory is handled again (a retried park). At the
	// next, the step is renewed under the park (still dispatched, same
	// epoch), so the park loses its CAS and parks again. The letter must
	// still be stored once, the first one.
	h := p.hooked()
	var marks atomic.Int32
	var reported atomic.Bool
	var first uint64
	h.hook = func() bool {
		if taskGone(t, queue, seq) && len(p.letters(t, genuine)) == 0 && !reported.Swap(true) {
			t.Errorf("task deleted while no genuine dead letter is stored")
		}
		if !inStepWrite() {
			return false
		}
		switch marks.Add(1) {
		case 1:
			if stored := p.letters(t, genuine); len(stored) > 0 {
				first = stored[0].Sequence
			}
			return true
		case 2:
			p.renew(t, "job-f")
		}
		return false
	}
	adv := maxDeliver(queue, "a1", seq)
	if err := p.rel.dead.exhausted(ctx, adv, raw); !errors.Is(err, errNotLeader) {
		t.Fatalf("first handling: %v, want errNotLeader", err)
	}
	if err := p.rel.dead.exhausted(ctx, adv, raw); err != nil {
		t.Fatal(err)
	}
	h.hook = nil
	if marks.Load() < 2 {
		t.Fatalf("the park was not retried (%d CAS checks)", marks.Load())
	}
	st, _, err := p.store.Step(ctx, "job-f", "s")
	if err != nil || st.State != jobstore.StepDeadLettered {
		t.Fatalf("step: %+v %v", st, err)
	}
	got := p.letters(t, genuine)
	if len(got) != 1 {
		t.Fatalf("%d dead letters on %s, want 1", len(got), genuine)
	}
	l := got[0]
	if l.Sequence != first {
		t.Errorf("dead letter %d, want %d (the one stored first)", l.Sequence, first)
	}
	if h := l.Header; h.Get(protocol.HeaderJob) != "job-f" || h.Get(protocol.HeaderStep) != "s" || h.Get(protocol.HeaderEpoch) != "1" ||
		h.Get(protocol.HeaderDLQReason) != string(protocol.DLQMaxDeliveries) ||
		h.Get(protocol.HeaderDLQDetail) != "delivered 5 times to agent a1 without an ack" || string(l.Data) != `{}` {
		t.Fatalf("dead letter: %v %s", l.Header, l.Data)
	}
	// The agent's own message is its business: left alone.
	if n := len(p.letters(t, protocol.DLQSubject("default", "evil"))); n != 1 {
		t.Fatalf("%d messages on the forger's subject, want 1", n)
	}

	// The task's own agent, forging on its own subject (the letter's) a
	// message with every header of the letter but another body: not the
	// letter either.
	queue, seq, raw = p.dispatchedTask(t, "job-g", "a1")
	fake = nats.NewMsg(genuine)
	for k, v := range raw.Header {
		fake.Header[k] = v
	}
	fake.Data = []byte(`{"forged":true}`)
	fake.Header.Set(protocol.HeaderMsgID, "dlq.job-g.s.1."+string(protocol.DLQMaxDeliveries))
	fake.Header.Set(protocol.HeaderDLQReason, string(protocol.DLQMaxDeliveries))
	fake.Header.Set(protocol.HeaderDLQDetail, "delivered 5 times to agent a1 without an ack")
	fake.Header.Set(protocol.HeaderDLQDeliveries, "5")
	fake.Header.Set(protocol.HeaderDLQStream, queue.CachedInfo().Config.Name)
	fake.Header.Set(protocol.HeaderDLQStreamSeq, strconv.FormatUint(seq, 10))
	fake.Header.Set(protocol.HeaderDLQTime, time.Now().UTC().Format(time.RFC3339Nano))
	if _, err := p.js.PublishMsg(ctx, fake); err != nil {
		t.Fatal(err)
	}
	adv.StreamSeq = seq
	if err := p.rel.dead.exhausted(ctx, adv, raw); err != nil {
		t.Fatal(err)
	}
	var bodies []string
	for _, m := range p.letters(t, genuine) {
		if m.Header.Get(protocol.HeaderJob) == "job-g" {
			bodies = append(bodies, string(m.Data))
		}
	}
	if !slices.Equal(bodies, []string{`{"forged":true}`, `{}`}) {
		t.Fatalf("job-g's messages on %s: %q, want the forgery and the letter", genuine, bodies)
	}
}

// succeedUnder hooks p's term so that, the first time a park is about to
// mark the step (it stored its letter; the task at seq of queue is still
// there until the mark), the step is recorded as succeeded: the agent's
// result won the race, and the park's CAS conflicts. fired says whether
// that happened.
func succeedUnder(t *testing.T, p *parts, queue jetstream.Stream, seq uint64, job string) (fired *atomic.Bool) {
	fired = &atomic.Bool{}
	p.hooked().hook = func() bool {
		if fired.Load() || !inStepWrite() {
			return false
		}
		if taskGone(t, queue, seq) {
			t.Errorf("the task was deleted before its step was marked")
		}
		fired.Store(true)
		p.changeStep(t, job, func(st *jobstore.Step) error {
			_, err := st.ApplyResult(protocol.Result{JobID: job, StepID: "s", Epoch: st.Epoch, Token: st.Token, Agent: st.Actor,
				Status: protocol.ResultSucceeded}, false, time.Now().UTC())
			return err
		})
		return false
	}
	return fired
}

// A park stores its letter before the CAS that marks the step
// dead_lettered (and deletes the task only after it, see park). When that CAS lost to a result and the
// step turned out to have moved on, its callers (exhausted, the
// releaser's poison, the transfer give-up) just returned, and the letter
// stayed in WARDEN_DLQ for a step that succeeded: `dlq ls` showed it, and
// `dlq retry` refused it. The letter is now withdrawn when its park is
// given up; a park that is retried after a lost CAS and succeeds keeps
// the letter it stored (its publish is deduplicated to it).
//
// Old code: "exhausted: 1 dead letters for a step that succeeded",
// "poison: 1 dead letters ..." and "transfer: 1 dead letters ...".
func TestLetterOfAParkThatLostToAResultIsWithdrawn(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, p *parts, what, job string, fired *atomic.Bool) {
		t.Helper()
		if !fired.Load() {
			t.Fatalf("%s: the step was never changed under the park", what)
		}
		st, _, err := p.store.Step(context.Background(), job, "s")
		if err != nil || st.State != jobstore.StepSucceeded {
			t.Fatalf("%s: step %+v %v", what, st, err)
		}
		if n := p.msgs(t, protocol.StreamDLQ); n != 0 {
			t.Errorf("%s: %d dead letters for a step that succeeded", what, n)
		}
	}

	t.Run("exhausted", func(t *testing.T) {
		t.Parallel()
		p := newParts(t)
		ctx := context.Background()
		queue, seq, raw := p.dispatchedTask(t, "job-e", "a1")
		fired := succeedUnder(t, p, queue, seq, "job-e")
		if err := p.rel.dead.exhausted(ctx, maxDeliver(queue, "a1", seq), raw); err != nil {
			t.Fatal(err)
		}
		check(t, p, "exhausted", "job-e", fired)
	})

	t.Run("poison", func(t *testing.T) {
		t.Parallel()
		p := newParts(t)
		ctx := context.Background()
		queue, seq, raw := p.poisonedTask(t, "job-p", "a2")
		fired := succeedUnder(t, p, queue, seq, "job-p")
		out, err := p.rel.release(ctx, "job-p", "s", cause{status: statusTransferred, reason: "agent a2 failed", agent: "a2", epoch: 1, suspect: true, task: raw})
		if err != nil || out != untouched {
			t.Fatalf("release: %v %v, want untouched", out, err)
		}
		check(t, p, "poison", "job-p", fired)
	})

	t.Run("transfer", func(t *testing.T) {
		t.Parallel()
		p := newParts(t)
		ctx := context.Background()
		queue, seq, raw := p.dispatchedTask(t, "job-t", "a3")
		x := newTransfers(p.term, p.js, p.store, p.rel, p.rel.dead, p.adv, NewMetrics(nil), streams.DefaultTaskShards, time.Second, p.rel.log)
		fired := succeedUnder(t, p, queue, seq, "job-t")
		w := &transferWatch{transferNote: transferNote{job: "job-t", step: "s", cluster: "c1", from: "a3"},
			policy: cluster.TransferPolicy{Timeout: time.Second, MaxRetries: 1}, retries: 1}
		if err := x.giveUp(ctx, w, "a3", raw); err != nil {
			t.Fatal(err)
		}
		check(t, p, "transfer", "job-t", fired)
	})

	// A park that lost its CAS to another park of the same dispatch
	// (failover and lease recovery both find the poison): the winner's
	// publish was deduplicated to the loser's letter, which the loser must
	// not withdraw.
	t.Run("lost to a park", func(t *testing.T) {
		t.Parallel()
		p := newParts(t)
		ctx := context.Background()
		queue, seq, raw := p.poisonedTask(t, "job-w", "a5")
		c := cause{status: statusTransferred, reason: "agent a5 failed", agent: "a5", epoch: 1, suspect: true, task: raw}
		var fired, inner atomic.Bool
		p.hooked().hook = func() bool {
			if inner.Load() || fired.Load() || !inStepWrite() {
				return false
			}
			fired.Store(true)
			inner.Store(true)
			defer inner.Store(false)
			if out, err := p.rel.release(ctx, "job-w", "s", c); err != nil || out != parked {
				t.Errorf("the other park: %v %v", out, err)
			}
			return false
		}
		if out, err := p.rel.release(ctx, "job-w", "s", c); err != nil || out != untouched {
			t.Fatalf("release: %v %v, want untouched", out, err)
		}
		st, _, err := p.store.Step(ctx, "job-w", "s")
		if !fired.Load() || err != nil || st.State != jobstore.StepDeadLettered {
			t.Fatalf("step: %+v %v (parked twice: %v)", st, err, fired.Load())
		}
		if n := p.msgs(t, protocol.StreamDLQ); n != 1 {
			t.Fatalf("%d dead letters for a dead-lettered step, want 1", n)
		}
		if !taskGone(t, queue, seq) {
			t.Fatal("poison task still queued after its step was parked")
		}
	})

	// A park that lost its CAS to a renewal (still dispatched, same
	// epoch) parks again, and its letter is the one it stored first: it
	// stays, once.
	t.Run("retried", func(t *testing.T) {
		t.Parallel()
		p := newParts(t)
		ctx := context.Background()
		queue, seq, raw := p.dispatchedTask(t, "job-r", "a4")
		var renewed atomic.Bool
		p.hooked().hook = func() bool {
			if renewed.Load() || !inStepWrite() {
				return false
			}
			renewed.Store(true)
			p.renew(t, "job-r")
			return false
		}
		if err := p.rel.dead.exhausted(ctx, maxDeliver(queue, "a4", seq), raw); err != nil {
			t.Fatal(err)
		}
		st, _, err := p.store.Step(ctx, "job-r", "s")
		if !renewed.Load() || err != nil || st.State != jobstore.StepDeadLettered {
			t.Fatalf("step: %+v %v (renewed under the park: %v)", st, err, renewed.Load())
		}
		if n := len(p.letters(t, protocol.DLQSubject("default", "a4"))); n != 1 || p.msgs(t, protocol.StreamDLQ) != 1 {
			t.Fatalf("%d dead letters on a4's subject (%d in all), want 1", n, p.msgs(t, protocol.StreamDLQ))
		}
	})
}

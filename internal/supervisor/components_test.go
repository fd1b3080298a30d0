package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// fakeLease is a lease whose current epoch the test sets; denied counts
// the answers "not the leader".
type fakeLease struct {
	epoch  atomic.Uint64
	denied atomic.Int64
}

func (f *fakeLease) Leader() (uint64, bool) {
	e := f.epoch.Load()
	if e == 0 {
		f.denied.Add(1)
	}
	return e, e != 0
}

// parts are a term's components on a test server, built as newLeader does.
type parts struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	store *jobstore.Store
	lease *fakeLease
	term  *term
	adv   *advancer
	rel   *releaser
	fo    *failover
}

func newParts(t *testing.T) *parts {
	t.Helper()
	_, nc, js := natstest.Start(t, streams.Options{})
	store, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	p := &parts{nc: nc, js: js, store: store, lease: &fakeLease{}}
	p.lease.epoch.Store(7)
	log := zerolog.Nop()
	m := NewMetrics(nil)
	p.term = &term{epoch: 7, lease: p.lease, js: js, store: store, events: events.NewPublisher(js), now: time.Now}
	p.adv = newAdvancer(nc, p.term, time.Second, log)
	dead := &deadLetters{js: js, term: p.term, store: store, adv: p.adv, metrics: m, shards: streams.DefaultTaskShards, retry: time.Second, log: log}
	p.rel = &releaser{term: p.term, store: store, dead: dead, metrics: m, poison: 3, log: log}
	p.fo = &failover{js: js, term: p.term, store: store, release: p.rel, adv: p.adv, metrics: m, shards: streams.DefaultTaskShards, log: log}
	return p
}

// dispatched stores a running job whose step is dispatched to agent at
// epoch 1 with a lease that ended, and queues its task in agent's queue.
func (p *parts) dispatched(t *testing.T, job, agent string) (jetstream.Stream, uint64) {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC()
	sp := spec.Job{Name: "d", Steps: []spec.Step{{ID: "s", Action: "echo"}}}
	j := jobstore.NewJob(job, sp, now.Add(-time.Hour))
	j.State = jobstore.JobRunning
	steps, err := jobstore.NewSteps(job, sp, jobstore.StepDefaults{Timeout: time.Minute}, now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := steps[0].Dispatch(agent, protocol.NewLeaseToken(), now.Add(-time.Hour), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := p.store.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	if _, err := p.store.CreateStep(ctx, steps[0]); err != nil {
		t.Fatal(err)
	}
	q, _ := agentQueue("default", agent, streams.DefaultTaskShards)
	m := nats.NewMsg(q.subject)
	m.Data = []byte(`{}`)
	m.Header.Set(protocol.HeaderJob, job)
	m.Header.Set(protocol.HeaderStep, "s")
	m.Header.Set(protocol.HeaderEpoch, "1")
	ack, err := p.js.PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	s, err := p.js.Stream(ctx, q.stream)
	if err != nil {
		t.Fatal(err)
	}
	return s, ack.Sequence
}

// recovery runs the term's recovery duty with grace; done yields what run
// returned, and stop ends it and fails the test if that was an error.
// Also stopped at the test's end.
func (p *parts) recovery(t *testing.T, grace time.Duration) (done <-chan error, stop func()) {
	t.Helper()
	r := &recovery{term: p.term, store: p.store, release: p.rel, adv: p.adv, grace: grace, retry: 50 * time.Millisecond,
		log: zerolog.Nop(), built: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch := make(chan error, 1)
	go func() { ch <- r.run(ctx) }()
	return ch, func() {
		cancel()
		if err := <-ch; err != nil {
			t.Errorf("recovery at shutdown: %v", err)
		}
	}
}

func (p *parts) msgs(t *testing.T, stream string) uint64 {
	t.Helper()
	s, err := p.js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// Issue 15: a deposed leader published a duplicate agent_failed event and
// its failover record before its fencing check. Every side effect now goes
// through the term, which checks the lease first: a deposed leader's
// failover, release, events and advance requests cause nothing at all.
func TestDeposedLeaderCausesNothing(t *testing.T) {
	t.Parallel()
	p := newParts(t)
	ctx := context.Background()
	queue, seq := p.dispatched(t, "job-d", "a1")
	asked := p.countAdvances(t)

	p.lease.epoch.Store(8) // a newer leader holds the lease
	_, err := p.fo.transfer(ctx, "default", "a1", "departed:x")
	if !errors.Is(err, errNotLeader) {
		t.Fatalf("deposed failover: %v", err)
	}
	out, err := p.rel.release(ctx, "job-d", "s", cause{status: statusLeaseExpired, expired: true, suspect: true})
	if !errors.Is(err, errNotLeader) || out != untouched {
		t.Fatalf("deposed release: %v %v", out, err)
	}
	if err := p.term.event(ctx, protocol.Event{Kind: protocol.EventAgentFailed, ID: "a1", Agent: "a1"}); !errors.Is(err, errNotLeader) {
		t.Fatalf("deposed event: %v", err)
	}
	if err := p.adv.Advance(ctx, "job-d"); !errors.Is(err, errNotLeader) {
		t.Fatalf("deposed advance: %v", err)
	}
	st, _, err := p.store.Step(ctx, "job-d", "s")
	if err != nil || st.State != jobstore.StepDispatched || st.Epoch != 1 || st.Actor != "a1" {
		t.Fatalf("step changed by a deposed leader: %+v %v", st, err)
	}
	if _, err := queue.GetMsg(ctx, seq); err != nil {
		t.Fatalf("task deleted by a deposed leader: %v", err)
	}
	if n := p.msgs(t, protocol.StreamEvents); n != 0 {
		t.Fatalf("a deposed leader published %d events", n)
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("a deposed leader asked %d advances", n)
	}

	// The same calls by the lease holder do it all.
	p.lease.epoch.Store(7)
	rec, err := p.fo.transfer(ctx, "default", "a1", "departed:x")
	if err != nil || rec.TasksMoved != 1 {
		t.Fatalf("failover by the leader: %+v %v", rec, err)
	}
	st, _, _ = p.store.Step(ctx, "job-d", "s")
	if st.State != jobstore.StepPending || st.TransferredFrom != "a1" || st.Recoveries != 0 {
		t.Fatalf("step after failover: %+v", st)
	}
	if _, err := queue.GetMsg(ctx, seq); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("task still queued after failover: %v", err)
	}
	if n := p.msgs(t, protocol.StreamEvents); n != 2 { // step_recovered, failover
		t.Fatalf("%d events after failover, want 2", n)
	}
	if n := asked.Load(); n != 1 {
		t.Fatalf("%d advance requests after failover, want 1", n)
	}
}

// Leader() says no for the moment a renewal takes past the lease's last
// sure instant, and yes again once it lands with the same epoch. The
// recovery loop used to return at the first fence that failed, and the term
// ran on without it: an expired lease was then never released while this
// process kept the lease from every standby. It now tries again later, and
// only the term's context ends it.
func TestRecoveryOutlivesAFenceThatFailsForAMoment(t *testing.T) {
	t.Parallel()
	p := newParts(t)
	p.lease.epoch.Store(0) // a renewal in flight past validTo
	p.dispatched(t, "job-f", "a1")
	done, stop := p.recovery(t, time.Hour)

	// The expired lease came due and met the failed fence.
	natstest.Eventually(t, 10*time.Second, "the recovery to meet the failed fence", func() bool { return p.lease.denied.Load() > 0 })
	p.lease.epoch.Store(7) // the renewal landed
	natstest.Eventually(t, 10*time.Second, "the expired lease to be released", func() bool {
		st, _, err := p.store.Step(context.Background(), "job-f", "s")
		return err == nil && st.State == jobstore.StepPending
	})
	select {
	case err := <-done:
		t.Fatalf("recovery stopped while its term went on: %v", err)
	default:
	}
	stop()
}

// An entry that comes due as a lease end the record does not hold (here
// an unreadable Warden-Locked-Until header, read as the write time; also a
// renewal not read yet, or a record without headers that could not be
// read) releases nothing. It used to leave the index then, and with no
// later write the step's real lease ended unwatched: dispatched forever.
// It is now looked at again after the backoff.
func TestLeaseTheIndexMisreadIsLookedAtAgain(t *testing.T) {
	t.Parallel()
	p := newParts(t)
	ctx := context.Background()
	p.dispatched(t, "job-m", "a1")
	st, _, err := p.store.Step(ctx, "job-m", "s")
	if err != nil {
		t.Fatal(err)
	}
	st.LockedUntil = time.Now().Add(time.Second).UTC() // the real lease: a second from now
	body, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("$KV." + protocol.BucketJobs + "." + protocol.StepKey("job-m", "s"))
	m.Data = body
	m.Header.Set(protocol.HeaderRecordState, string(jobstore.StepDispatched))
	m.Header.Set(protocol.HeaderRecordLockedUntil, "not a time")
	if _, err := p.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	_, stop := p.recovery(t, 200*time.Millisecond)
	natstest.Eventually(t, 10*time.Second, "the step released once its real lease ended", func() bool {
		st, _, err := p.store.Step(context.Background(), "job-m", "s")
		return err == nil && st.State == jobstore.StepPending && st.Attempts[0].Status == statusLeaseExpired
	})
	stop()
}

// A max-deliveries advisory for a task whose step is back to pending at
// the same epoch (released after its lease, or reopened by an operator,
// not dispatched again yet) is about a stale task: the task is deleted and
// the step left to be dispatched. It used to be parked in the DLQ.
func TestExhaustedTaskOfAReleasedStepIsStale(t *testing.T) {
	t.Parallel()
	p := newParts(t)
	ctx := context.Background()
	queue, seq := p.dispatched(t, "job-x", "a1")
	if out, err := p.rel.release(ctx, "job-x", "s", cause{status: statusLeaseExpired, expired: true}); err != nil || out != requeued {
		t.Fatalf("release: %v %v", out, err)
	}
	raw, err := queue.GetMsg(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.rel.dead.exhausted(ctx, advisory{Stream: queue.CachedInfo().Config.Name, Consumer: "a1", StreamSeq: seq, Deliveries: 5}, raw); err != nil {
		t.Fatal(err)
	}
	st, _, err := p.store.Step(ctx, "job-x", "s")
	if err != nil || st.State != jobstore.StepPending {
		t.Fatalf("step after a stale advisory: %+v %v", st, err)
	}
	if _, err := queue.GetMsg(ctx, seq); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("stale task still queued: %v", err)
	}
	if n := p.msgs(t, protocol.StreamDLQ); n != 0 {
		t.Fatalf("%d dead letters for a stale task", n)
	}
}

// Poison: a step taken back from its agents poison_threshold times is
// parked in the dead-letter stream with its task, not released again.
func TestReleaserParksPoison(t *testing.T) {
	t.Parallel()
	p := newParts(t)
	ctx := context.Background()
	queue, seq := p.dispatched(t, "job-p", "a2")
	st, rev, _ := p.store.Step(ctx, "job-p", "s")
	st.Recoveries = 2
	if _, err := p.store.UpdateStep(ctx, st, rev); err != nil {
		t.Fatal(err)
	}
	raw, err := queue.GetMsg(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.rel.release(ctx, "job-p", "s", cause{status: statusTransferred, reason: "agent a2 failed", agent: "a2", epoch: 1, suspect: true, task: raw})
	if err != nil || out != parked {
		t.Fatalf("release: %v %v", out, err)
	}
	st, _, _ = p.store.Step(ctx, "job-p", "s")
	if st.State != jobstore.StepDeadLettered {
		t.Fatalf("step %s", st.State)
	}
	if n := p.msgs(t, protocol.StreamDLQ); n != 1 {
		t.Fatalf("%d dead letters", n)
	}
	if _, err := queue.GetMsg(ctx, seq); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("poison task still queued: %v", err)
	}
	// A task of an older epoch releases nothing.
	if out, err := p.rel.release(ctx, "job-p", "s", cause{status: statusTransferred, agent: "a2", epoch: 1}); err != nil || out != untouched {
		t.Fatalf("release of a finished step: %v %v", out, err)
	}
}

func TestTaskOwnerAcceptsOnlyTheDerivedQueue(t *testing.T) {
	t.Parallel()
	const shards = 4
	q, ok := agentQueue("default", "a1", shards)
	if !ok || q.stream != protocol.TaskStream(q.shard) || q.subject != protocol.TaskSubject(q.shard, "default", "a1") || q.consumer != "a1" {
		t.Fatalf("agentQueue: %+v %v", q, ok)
	}
	if got, ok := taskOwner(q.subject, shards); !ok || got != q {
		t.Fatalf("taskOwner(%s) = %+v %v", q.subject, got, ok)
	}
	wrongShard := (q.shard + 1) % shards
	for _, subj := range []string{
		protocol.TaskSubject(wrongShard, "default", "a1"), // not the shard its pool and id hash to
		"warden.result.default.a1.j.s",
		"warden.dlq.default.a1",
		"warden.task." + strconv.Itoa(q.shard) + ".default.a1.extra",
		"warden.task." + strconv.Itoa(q.shard) + ".default.*",
		"warden.task." + strconv.Itoa(q.shard) + ".default.>",
	} {
		if got, ok := taskOwner(subj, shards); ok {
			t.Errorf("taskOwner(%s) accepted: %+v", subj, got)
		}
	}
	if _, ok := agentQueue("default", "a.b", shards); ok {
		t.Error("agentQueue accepted an id with a dot")
	}
}

func TestCheckExhaustedConfirmsOnlyWhatTheConsumerShows(t *testing.T) {
	t.Parallel()
	q, _ := agentQueue("default", "a1", 4)
	adv := advisory{Stream: q.stream, Consumer: "a1", StreamSeq: 10, Deliveries: 5}
	genuine := func() *jetstream.ConsumerInfo {
		return &jetstream.ConsumerInfo{
			Config:         jetstream.ConsumerConfig{FilterSubject: q.subject, MaxDeliver: 5},
			Delivered:      jetstream.SequenceInfo{Stream: 12},
			NumRedelivered: 1,
		}
	}
	if err := checkExhausted(genuine(), q, adv, 10); err != nil {
		t.Fatalf("genuine: %v", err)
	}
	var rej *rejection
	cases := map[string]func(*jetstream.ConsumerInfo){
		"other filter":      func(i *jetstream.ConsumerInfo) { i.Config.FilterSubject = "warden.task.0.default.b" },
		"fewer deliveries":  func(i *jetstream.ConsumerInfo) { i.Config.MaxDeliver = 9 },
		"unbounded":         func(i *jetstream.ConsumerInfo) { i.Config.MaxDeliver = -1 },
		"never delivered":   func(i *jetstream.ConsumerInfo) { i.Delivered.Stream = 9 },
		"nothing redeliver": func(i *jetstream.ConsumerInfo) { i.NumRedelivered = 0 },
	}
	for name, edit := range cases {
		info := genuine()
		edit(info)
		if err := checkExhausted(info, q, adv, 10); !errors.As(err, &rej) {
			t.Errorf("%s: %v, want a rejection", name, err)
		}
	}
	// Deliveries in flight: the message may be one of them (awaiting its
	// redelivery) unless the ack floor has passed it.
	inFlight := genuine()
	inFlight.NumAckPending = 2
	inFlight.AckFloor.Stream = 9
	if err := checkExhausted(inFlight, q, adv, 10); !errors.Is(err, errUnconfirmed) {
		t.Errorf("deliveries in flight above the message: %v, want errUnconfirmed", err)
	}
	passed := genuine()
	passed.NumAckPending = 2
	passed.AckFloor.Stream = 10
	if err := checkExhausted(passed, q, adv, 10); err != nil {
		t.Errorf("ack floor at the message, deliveries in flight above it: %v, want confirmed", err)
	}
}

func TestConfirmRetryBacksOffToItsBound(t *testing.T) {
	t.Parallel()
	var got []time.Duration
	for n := uint64(1); n <= 8; n++ {
		got = append(got, confirmRetry(time.Second, n))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, maxConfirmRetry, maxConfirmRetry,
		maxConfirmRetry, maxConfirmRetry, maxConfirmRetry}
	if !slices.Equal(got, want) {
		t.Fatalf("confirmRetry: %v, want %v", got, want)
	}
}

// fakeView is a presence view whose settledness the test sets.
type fakeView struct{ settled atomic.Bool }

func (f *fakeView) Settled(time.Duration, time.Time) bool { return f.settled.Load() }

// Issue 15: "I could not see" is not "it is gone". A new term, and any
// gap, leave the leader blind for one presence TTL; a view that is not
// settled keeps it blind.
func TestSightIsBlindForOneTTLAfterAGap(t *testing.T) {
	t.Parallel()
	_, nc, _ := natstest.Start(t, streams.Options{})
	t0 := time.Unix(10_000, 0)
	now := t0
	v := &fakeView{}
	v.settled.Store(true)
	s := newSight(nc, v, 3*time.Second, func() time.Time { return now })
	if ok, at := s.clear(t0); ok || !at.Equal(t0.Add(3*time.Second)) {
		t.Fatalf("a new term is clear at once (%v, %v)", ok, at)
	}
	if ok, _ := s.clear(t0.Add(3 * time.Second)); !ok {
		t.Fatal("not clear one TTL after the term began")
	}
	now = t0.Add(10 * time.Second)
	s.gap(now)
	if ok, at := s.clear(now.Add(2 * time.Second)); ok || !at.Equal(now.Add(3*time.Second)) {
		t.Fatalf("clear within a TTL of a gap (%v, %v)", ok, at)
	}
	if ok, _ := s.clear(now.Add(3 * time.Second)); !ok {
		t.Fatal("not clear one TTL after the gap")
	}
	v.settled.Store(false) // the view is re-syncing
	if ok, at := s.clear(now.Add(time.Minute)); ok || !at.After(now.Add(time.Minute)) {
		t.Fatalf("clear while the view is not settled (%v, %v)", ok, at)
	}
}

// The MAX_DELIVERIES advisory of a task is confirmed from the consumer's
// ack floor, not from its deliveries in flight as a whole: once nothing
// was pending after the server gave up on the task, the floor has passed
// it for good, and the advisory is confirmed even while the agent works
// on later tasks. Before, any delivery in flight refused it (five checks,
// then the step waited for its lease, minutes). While a delivery below it
// may still be pending it is unconfirmed, and after the task's deadline
// it is rejected (the lease recovery owns the step then).
func TestExhaustedTaskConfirmedByTheAckFloorWhileOthersRun(t *testing.T) {
	t.Parallel()
	p := newParts(t)
	ctx := context.Background()
	dead := p.rel.dead
	q, _ := agentQueue("default", "a3", streams.DefaultTaskShards)
	cc, err := streams.TaskConsumer(q.shard, q.pool, q.agent, time.Minute, 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := p.js.CreateOrUpdateConsumer(ctx, q.stream, cc)
	if err != nil {
		t.Fatal(err)
	}
	task := func(job string) uint64 {
		m := nats.NewMsg(q.subject)
		m.Data = []byte(`{}`)
		m.Header.Set(protocol.HeaderJob, job)
		m.Header.Set(protocol.HeaderStep, "s")
		m.Header.Set(protocol.HeaderEpoch, "1")
		m.Header.Set(protocol.HeaderDeadline, time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano))
		ack, err := p.js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	next := func(want string) jetstream.Msg {
		t.Helper()
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("fetch %s: %v", want, err)
		}
		if got := m.Headers().Get(protocol.HeaderJob); got != want {
			t.Fatalf("fetched %s, want %s", got, want)
		}
		return m
	}
	poison := task("job-poison")
	for range 2 { // its two deliveries, each handed back
		if err := next("job-poison").Nak(); err != nil {
			t.Fatal(err)
		}
	}
	task("job-long")
	long := next("job-long") // the server gives up on the poison task here
	adv := advisory{Type: advisoryMaxDeliver, Stream: q.stream, Consumer: q.consumer, StreamSeq: poison, Deliveries: 2}

	if _, err := dead.confirm(ctx, adv); !errors.Is(err, errUnconfirmed) {
		t.Fatalf("with a delivery in flight and the floor below the task: %v, want errUnconfirmed", err)
	}
	if err := long.DoubleAck(ctx); err != nil { // nothing pending: the floor jumps past the task
		t.Fatal(err)
	}
	task("job-later")
	later := next("job-later") // in flight again
	defer func() { _ = later.Ack() }()
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 1 || info.AckFloor.Stream < poison {
		t.Fatalf("consumer: %d in flight, ack floor %d; want 1 and at least %d", info.NumAckPending, info.AckFloor.Stream, poison)
	}
	raw, err := dead.confirm(ctx, adv)
	if err != nil || raw == nil || raw.Sequence != poison {
		t.Fatalf("confirm with the floor past the task: %v %v, want the task", raw, err)
	}

	// Still unconfirmed (handed back, awaiting redelivery) when the task's
	// deadline has passed: rejected.
	p2 := task("job-poison-2")
	for range 2 {
		_ = next("job-poison-2").Nak()
	}
	p.term.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	var rej *rejection
	if _, err := dead.confirm(ctx, advisory{Type: advisoryMaxDeliver, Stream: q.stream, Consumer: q.consumer, StreamSeq: p2, Deliveries: 2}); !errors.As(err, &rej) {
		t.Fatalf("unconfirmed past the deadline: %v, want a rejection", err)
	}
}

// countAdvances answers every advance request a test's components send
// (as a scheduler would) and counts them.
func (p *parts) countAdvances(t *testing.T) *atomic.Int32 {
	t.Helper()
	var asked atomic.Int32
	sub, err := p.nc.Subscribe(protocol.SubjectControlAdvance, func(m *nats.Msg) {
		asked.Add(1)
		_ = m.Respond(protocol.OKReply(""))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := p.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &asked
}

// A failover that stops part-way (a task's delete fails: the leadership
// was lost, the server went away) has released some steps already; their
// jobs are asked to advance at once. It returned before asking, and the
// failover tried again found those steps pending, none of its doing, and
// asked nothing either: they waited for the recovery grace (30 s).
func TestFailoverStoppedPartWayAsksForWhatItMoved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newParts(t)
	p.dispatched(t, "job-1", "a1")
	p.dispatched(t, "job-2", "a1")
	var mu sync.Mutex
	var asked []string
	sub, err := p.nc.Subscribe(protocol.SubjectControlAdvance, func(m *nats.Msg) {
		mu.Lock()
		asked = append(asked, string(m.Data))
		mu.Unlock()
		_ = m.Respond(protocol.OKReply(""))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := p.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var deletes atomic.Int32
	p.hooked().hook = func() bool {
		return inTermCall("deleteMsg") && deletes.Add(1) == 2 // the second task's delete
	}
	if _, err := p.fo.transfer(ctx, "default", "a1", "departed:x"); err == nil {
		t.Fatal("the failover went through a failed delete")
	}
	st, _, err := p.store.Step(ctx, "job-1", "s")
	if err != nil || st.State != jobstore.StepPending {
		t.Fatalf("job-1's step after the stopped failover: %+v, %v; want released", st, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(asked, "job-1") {
		t.Fatalf("advance asks %v: job-1, whose step the failover released, was not asked for", asked)
	}
}

package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Bounds of one worker turn. A turn applies a batch of inputs to the jobs
// they name, then writes everything the batch changed in pipelined rounds.
// The slices keep a large job from holding a worker: it gets at most
// sliceInputs inputs and sliceDispatch dispatches per turn, and continues
// behind the other jobs' inputs. They are small because what a slice
// writes queues ahead of every other job's writes at the server: with 64,
// single-step probes took up to 100 ms (p99) while a 1,000-step fan-out
// ran; with 8, 27-40 ms; with 4, 23-28 ms, the fan-out taking 0.3-0.5 s
// → 0.8-1.1 s (target 2 s; docs/performance.md).
const (
	turnInputs    = 256
	sliceInputs   = 4
	sliceDispatch = 4
	maxTries      = 8
	conflictRetry = 50 * time.Millisecond
)

// worker owns the jobs whose ids hash to it: it alone, in this process,
// reads and writes them, so it keeps their records between inputs.
type worker struct {
	s     *Scheduler
	q     *queue
	cache map[string]*jobState
	// waiting holds jobs with a ready step that found no agent or no free
	// slot; a presence or capacity change wakes them. Written only by
	// setWaiter and dropWaiter, which keep orders (waitorder.go).
	waiting map[string]waiter
	orders  waitOrders
	log     zerolog.Logger
	// lastWake (unix nanos) rate-limits wakes from presence changes.
	lastWake atomic.Int64
	// turns counts turns; a cached job remembers the turn that last used
	// it, so the least recently used are dropped when the cache is full.
	turns uint64
	// gated holds, per job and step, until when the step waits in a
	// concurrency key's queue: wakes before then skip the key's record
	// (workflow.go). By job, so that a freed slot's wake (gateFreed) and a
	// finished job forget their steps without a walk of every entry.
	gated map[string]map[string]time.Time
	// wakes holds, per job, when its pending gate wake fires (wakeAt).
	wakes map[string]time.Time
	// deadlines holds the timers of the jobs' timeouts (timeout.go),
	// stopped when their job finishes.
	deadlines map[string]deadlineWake
	// gateSpent is the time this turn spent asking concurrency keys and
	// rate limits; past gateBudget the turn's remaining steps ask on a
	// later turn (workflow.go).
	gateSpent time.Duration
	// ctx is the context run was given, for the calls a turn makes
	// outside its write rounds (concurrency keys, rate limits).
	ctx context.Context
	// lastSweep is when dueRetries last looked at the waiting jobs.
	lastSweep time.Time
}

// maxCachedJobs bounds the jobs one worker keeps in memory; a dropped job
// is read again (one or two requests) when its next input comes.
const maxCachedJobs = 4096

// trimCache drops the least recently used half of the cache when it is
// full: jobs that wait long (a step running for minutes) cost a re-read,
// not memory for their whole life.
func (w *worker) trimCache() {
	if len(w.cache) <= maxCachedJobs {
		return
	}
	uses := make([]uint64, 0, len(w.cache))
	for _, js := range w.cache {
		uses = append(uses, js.used)
	}
	slices.Sort(uses)
	cut := uses[len(uses)/2]
	for id, js := range w.cache {
		if js.used <= cut {
			delete(w.cache, id)
		}
	}
}

// waiter is a job waiting for an agent or a slot, or held back by a gate
// (concurrency key, rate limit) or a retry backoff.
type waiter struct {
	inFlight int       // its steps in flight when it last found no slot
	since    time.Time // when it began to wait
	// gate says it waits for a gate or a backoff, not for an agent: its
	// own wake (wakeAt) or retryAt brings it back, and presence changes
	// and freed slots pass it by (waking every gated job at each freed
	// slot stormed the concurrency key's record).
	gate bool
	// held are the job's messages, kept unacknowledged while it waits: the
	// durable claim on its dispatch if this process dies. Handing them back
	// to the stream (a Nak with delay) made the server redeliver each
	// waiting job every capacity_retry, a third of the scheduler's
	// deliveries at full load (docs/performance.md, session 7).
	held []jetstream.Msg
	// retryAt is when the job is tried again if no wake comes first: the
	// in-memory form of the redelivery the Nak asked for.
	retryAt time.Time
	// extended is when the held messages' ack deadline last started (their
	// delivery, or the last InProgress); past half the ack wait they are
	// extended.
	extended time.Time
	// readAt is when the job's records were last read from the store. A
	// cached copy goes stale when another scheduler changes the job (an
	// advance request, a cancel among them, goes to any scheduler), and a
	// waiting job's wakes write nothing, so no lost CAS tells this one: it
	// kept a cancelled job's messages, extended for ever, and its place in
	// the priority backlog. A wake at least wait_retry after the last read
	// reads the job again.
	readAt time.Time
	// dueSeq, extendSeq and wakeSeq stamp its current entry in each of
	// the worker's orders (waitorder.go).
	dueSeq, extendSeq, wakeSeq uint64
}

// wakeBudget is how many waiting jobs one wake retries in a worker. A wake
// comes with each freed slot (at most every wakeEvery) and with each
// presence change; retrying every waiting job at each was 5 attempts per
// dispatch with 1,500 jobs waiting (11,000 a second). The rest wait for
// the next wake or their retry (capacity_retry, dueRetries).
const wakeBudget = 16

// wakeEvery bounds how often presence changes wake a worker's waiting jobs.
const wakeEvery = 50 * time.Millisecond

// wake asks the worker to retry its waiting jobs (from any goroutine);
// now is time.Now().UnixNano(), read once by the caller for every worker
// (a freed slot wakes them all).
func (w *worker) wake(now int64) {
	last := w.lastWake.Load()
	if now-last < int64(wakeEvery) || !w.lastWake.CompareAndSwap(last, now) {
		return
	}
	w.q.push(input{kind: inWake})
}

// expandWakes turns a wake into one input per waiting job, those with the
// fewest steps in flight first: when a slot frees, a small job waiting
// behind a large fan-out gets it before the fan-out takes the rest.
func (w *worker) expandWakes(batch []input) []input {
	out := batch[:0:0]
	for _, in := range batch {
		if in.kind != inWake || in.job != "" {
			out = append(out, in)
			continue
		}
		for _, id := range w.firstToWake(wakeBudget) {
			out = append(out, input{kind: inWake, job: id})
		}
	}
	return out
}

func newWorker(s *Scheduler) *worker {
	return &worker{s: s, q: newQueue(), cache: map[string]*jobState{}, waiting: map[string]waiter{}, orders: newWaitOrders(), log: s.log,
		ctx: context.Background(), gated: map[string]map[string]time.Time{}, wakes: map[string]time.Time{},
		deadlines: map[string]deadlineWake{}}
}

// run handles turns until ctx ends, then hands back what it holds.
func (w *worker) run(ctx context.Context) {
	w.ctx = ctx
	defer w.handBackHeld()
	for {
		batch := w.q.take(turnInputs)
		if ctx.Err() == nil { // stopping: finish what is queued, retry nothing
			batch = append(batch, w.dueRetries(w.s.now())...)
		}
		if len(batch) == 0 {
			var sweep <-chan time.Time // nil: nothing waits, nothing to sweep
			if len(w.waiting) > 0 {
				sweep = time.After(w.sweepEvery())
			}
			select {
			case <-ctx.Done():
				return
			case <-w.q.signal:
			case <-sweep:
			}
			continue
		}
		w.turn(ctx, batch)
	}
}

// sweepEvery is how often an idle worker looks for waiting jobs due a
// retry or an extension of their held messages.
func (w *worker) sweepEvery() time.Duration {
	return max(min(w.s.cfg.CapacityRetry.Std()/4, 50*time.Millisecond), time.Millisecond)
}

// dueRetries returns a wake for every waiting job whose retry is due (at
// most turnInputs, at most once per sweepEvery), and extends the ack
// deadline of messages held for longer than half the ack wait.
func (w *worker) dueRetries(now time.Time) []input {
	if len(w.waiting) == 0 || now.Sub(w.lastSweep) < w.sweepEvery() {
		return nil
	}
	w.lastSweep = now
	w.extendHeld(now, now.Add(-w.s.cfg.AckWait.Std()/2))
	var out []input
	reloads := 0
	for _, id := range w.dueBy(now, turnInputs) {
		in := input{kind: inWake, job: id, at: now}
		if reloads < reloadBudget && now.Sub(w.waiting[id].readAt) >= w.s.cfg.WaitRetry.Std() {
			in.reload = true
			reloads++
		}
		out = append(out, in)
	}
	return out
}

// reloadBudget bounds the waiting jobs one sweep asks the store about
// (changedElsewhere): jobs submitted together wait and come due together,
// and each question is a read inside the worker's turn.
const reloadBudget = 16

// changedElsewhere says whether job's cached records may be stale. Between
// dispatch rounds, always: read again in full, as another process may have
// written only a step's record (the supervisor's release of a step writes
// no job record). A job whose round is under way (steps it tried and must
// try again are kept aside in blocked) keeps its cache unless the job
// record's revision moved: read again, the round started over from its
// first step, and a large fan-out at capacity never finished one. A read
// that fails changes nothing until the next one.
func (w *worker) changedElsewhere(ctx context.Context, job string) bool {
	js := w.cache[job]
	if js == nil {
		return false // read afresh anyway
	}
	if len(js.blocked) == 0 {
		return true
	}
	rctx, cancel := context.WithTimeout(ctx, w.s.cfg.WriteTimeout.Std())
	defer cancel()
	_, rev, err := w.s.store.Job(rctx, job)
	if errors.Is(err, jobstore.ErrNotFound) {
		return true // gone: reading it again says so
	}
	return err == nil && rev != js.jobRev
}

// markRead notes that a waiting job's records were (or are about to be)
// read from the store (waiter.readAt).
func (w *worker) markRead(job string) {
	if wt, ok := w.waiting[job]; ok {
		wt.readAt = w.s.now()
		w.setWaiter(job, wt)
	}
}

// takeHeld removes and returns the messages held for a waiting job; its
// turn settles them with its own.
func (w *worker) takeHeld(id string) []jetstream.Msg {
	wt, ok := w.waiting[id]
	if !ok || len(wt.held) == 0 {
		return nil
	}
	held := wt.held
	wt.held = nil
	w.setWaiter(id, wt)
	w.s.holds.give(id, len(held))
	return held
}

// handBackHeld returns every held message to its stream when the worker
// stops, so that the scheduler taking its partition has them at once
// rather than after the ack wait. A job behind a gate or a backoff comes
// back when it is due, at most an ack wait from now (the longest a message
// held for it would have taken): all at once, thousands of them asked
// their gates together at the new owner.
func (w *worker) handBackHeld() {
	now := w.s.now()
	for id, wt := range w.waiting {
		for _, m := range wt.held {
			if d := min(wt.retryAt.Sub(now), w.s.cfg.AckWait.Std()); wt.gate && d > 0 {
				_ = m.NakWithDelay(d)
			} else {
				_ = m.Nak()
			}
		}
		w.s.holds.give(id, len(wt.held))
	}
}

// jobTurn is one job's part of a turn.
type jobTurn struct {
	id     string
	js     *jobState
	inputs []input
	// settle says what to do with each input's message once the writes
	// landed.
	settle []settlement
	tasks  []task
	events []outEvent
	// landed holds what was written: a step's index, or -1 for the job
	// record (which holds an inline job's steps).
	landed map[int]bool
	// unsure holds the writes whose outcome is unknown (no PubAck in time):
	// step indexes, or -1 for the job record.
	unsure map[int]bool
	// controls are cancel orders to agents, sent after the writes.
	controls []control
	replies  []reply
	// counts are the turn's metric increments, made in finish once what
	// they count is stored: counted as decided, a lost CAS counted them
	// again with every retry.
	counts []count

	// rounds are the turn's writes in the order they must land
	// (jobState.writes).
	rounds writeRounds
	// admitted are the steps that took concurrency slots this turn
	// (workflow.go); they are given back if the writes do not land.
	admitted []int
	// grants are the concurrency slots each admitted step took this turn.
	grants map[int][]gateGrant
	// freed are the steps whose concurrency slots (or places in a key's
	// queue) are given back once the turn's writes landed (finish): steps
	// that ended or went back to wait in this turn (workflow.go).
	freed []int
	err   error // a lost CAS or a store error: the inputs are retried
	// more: the job's turn is not done (more ready steps than one slice,
	// records still to seal, or records created that it may end after):
	// it continues in a next turn.
	more bool
	// wait, when set, says the job waits (no agent, a gate, a retry's
	// backoff): it is tried again after this delay if nothing wakes it
	// first. It keeps its messages meanwhile (waiter.held, within the hold
	// budget).
	wait     time.Duration
	finished bool
	// fresh says the job's state was read from the store (or created) in
	// this turn; reload asks for that before an input can be judged.
	fresh, reload bool
	// gone says the job's records were not found: a waiter of it (its
	// records purged while it waited) lets its held messages go.
	gone bool
	// agentWait says a step waits for an agent or a free slot (not for a
	// gate or a backoff).
	agentWait bool
}

// task is a dispatch to publish once step idx's record has landed; a
// republished one's record is already stored.
type task struct {
	idx       int
	msg       *nats.Msg
	republish bool
}

// count is one metric increment of a turn. write is the record it
// counts: a step's index, -1 the job record, or noWrite (a refusal: it
// stands once the turn's inputs are settled).
type count struct {
	write int
	inc   func(Metrics, string) // a Metrics method expression
	label string
}

// Increments without a label, in count's shape: method values with no
// captured state, so recording one allocates nothing on the turn's path.
var (
	countJobAccepted    = func(m Metrics, _ string) { m.JobAccepted() }
	countStepDispatched = func(m Metrics, _ string) { m.StepDispatched() }
	countStaleResult    = func(m Metrics, _ string) { m.StaleResult() }
)

const noWrite = -2

// count adds a metric increment, made in finish if the turn's writes
// landed, or in retry if its record did (the retry re-reads it and does
// not count again).
func (jt *jobTurn) count(write int, inc func(Metrics, string), label string) {
	jt.counts = append(jt.counts, count{write, inc, label})
}

// countLanded makes the turn's increments: all of them (all, the writes
// landed), or those whose record landed.
func (w *worker) countLanded(jt *jobTurn, all bool) {
	for _, c := range jt.counts {
		if all || jt.wrote(c.write) {
			c.inc(w.s.metrics, c.label)
		}
	}
	jt.counts = nil
}

// wrote says the turn's write of a record landed: a step's index, -1 the
// job record; noWrite never.
func (jt *jobTurn) wrote(write int) bool {
	if write >= 0 && jt.js != nil && jt.js.job.Inline {
		write = -1 // an inline job's steps are in its record
	}
	return write != noWrite && jt.landed[write]
}

type settlement struct {
	term string // non-empty: terminate the message with this reason
}

// control is an order to an agent. write is the step record whose change
// it carries out, as in count: sent if that write landed, even when
// another write of the turn lost (the retry finds the step's desired
// state written and does not send it again); noWrite, if the turn's
// writes all landed.
type control struct {
	subject string
	body    []byte
	write   int
}

type reply struct {
	to   string
	body []byte
}

func (w *worker) turn(ctx context.Context, batch []input) {
	var (
		order []*jobTurn
		byJob = map[string]*jobTurn{}
		later []input
	)
	for _, in := range w.expandWakes(batch) {
		jt := byJob[in.job]
		if jt == nil {
			jt = &jobTurn{id: in.job}
			byJob[in.job] = jt
			order = append(order, jt)
		}
		if len(jt.inputs) >= sliceInputs {
			later = append(later, in)
			continue
		}
		if in.kind == inGateFreed {
			w.gateFreed(in.job)
			in.kind = inWake
		}
		if in.kind == inWake && in.job != "" {
			// A timer's wake (wakeAt) that came due: its entry goes, or
			// jobs that end elsewhere (a partition moved) left theirs.
			if due, ok := w.wakes[in.job]; ok && !due.After(w.s.now()) {
				delete(w.wakes, in.job)
			}
			if d, ok := w.deadlines[in.job]; ok && !d.at.After(w.s.now()) {
				delete(w.deadlines, in.job) // fired: a later turn may arm it again
			}
		}
		if in.reload {
			w.markRead(in.job) // the question below counts as a read
		}
		if in.kind == inAdvance || (in.reload && w.changedElsewhere(ctx, in.job)) {
			// Someone else changed the job (released a step, cancelled it):
			// what this worker cached is out of date.
			delete(w.cache, in.job)
		}
		jt.inputs = append(jt.inputs, in)
	}
	if len(later) > 0 {
		w.q.push(later...)
	}
	now := w.s.now().UTC()
	w.turns++
	w.gateSpent = 0
	for _, jt := range order {
		w.prepare(ctx, jt, now)
		if jt.js != nil {
			jt.js.used = w.turns
		}
		if jt.js != nil || jt.gone {
			// A waiting job's held messages are settled by whatever turn
			// looks at it next, as if they had been redelivered with its
			// input. A turn that does not (every input rejected or delayed
			// before the job's state was read) leaves them to the waiter:
			// taken with it, they were acked and the waiter dropped, and
			// nothing woke the job again.
			jt.inputs[0].held = append(jt.inputs[0].held, w.takeHeld(jt.id)...)
		}
	}
	for k := 0; w.writeRound(ctx, order, k); k++ {
	}
	w.publish(ctx, order)
	for _, jt := range order {
		w.finish(jt)
	}
	w.trimCache()
}

// writeRound writes the k-th round (jobState.writes) of every job still
// going, pipelined, and says whether any job had one: a job with a write
// that failed in an earlier round writes nothing more.
func (w *worker) writeRound(ctx context.Context, order []*jobTurn, k int) bool {
	b := w.s.store.Batch()
	type ref struct {
		jt  *jobTurn
		idx int
	}
	var refs []ref
	for _, jt := range order {
		if jt.err != nil || k >= jt.rounds.n {
			continue
		}
		idx := jt.rounds.idx[k]
		for n, wr := range jt.rounds.writes[k] {
			b.Add(wr)
			refs = append(refs, ref{jt, idx[n]})
		}
	}
	if b.Len() == 0 {
		return false
	}
	wctx, cancel := context.WithTimeout(ctx, w.s.cfg.WriteTimeout.Std())
	defer cancel()
	for k, r := range b.Wait(wctx) {
		res := refs[k]
		jt := res.jt
		if r.Err != nil {
			if jt.err == nil {
				jt.err = r.Err
			}
			if !errors.Is(r.Err, jobstore.ErrConflict) && !errors.Is(r.Err, jobstore.ErrExists) {
				// No PubAck in time, or none at all: the write may have
				// landed. Its step keeps the gates it was admitted with
				// (releaseAdmitted); their leases free them if it did not.
				if jt.unsure == nil {
					jt.unsure = map[int]bool{}
				}
				jt.unsure[res.idx] = true
			}
			continue
		}
		if jt.landed == nil {
			jt.landed = map[int]bool{}
		}
		jt.landed[res.idx] = true
		if res.idx < 0 {
			jt.js.jobRev = r.Rev
			if jt.js.job.Inline {
				for i := range jt.js.revs {
					jt.js.revs[i] = r.Rev
				}
			}
		} else {
			jt.js.revs[res.idx] = r.Rev
		}
	}
	return true
}

// publish sends the tasks, events and cancel orders whose writes landed
// (those of a job whose writes all landed, and those that carry out a
// write of their own: see task, outEvent, control), waits for the tasks'
// and events' PubAcks, then sends the cancel orders and replies.
func (w *worker) publish(ctx context.Context, order []*jobTurn) {
	type pending struct {
		jt   *jobTurn
		f    jetstream.PubAckFuture
		msg  *nats.Msg
		task bool
	}
	// A task that is not stored fails the job's turn: its inputs are handed
	// back, not acked, and their redelivery re-reads the job, which
	// publishes the task again (republish, same Nats-Msg-Id). Otherwise a
	// publish lost in a server restart leaves the step waiting for its lease.
	taskFailed := func(jt *jobTurn, subject string, err error) {
		if jt.err == nil {
			jt.err = fmt.Errorf("publish task %s: %w", subject, err)
		}
	}
	var futs []pending
	for _, jt := range order {
		// A step whose dispatch landed gets its task even if another write
		// of the turn lost a race: otherwise it would wait for its lease.
		for _, t := range jt.tasks {
			if !jt.wrote(t.idx) && !t.republish {
				continue
			}
			m := t.msg
			f, err := w.s.js.PublishMsgAsync(m)
			if err != nil {
				w.log.Warn().Err(err).Str("subject", m.Subject).Msg("task publish failed; the job's inputs are handed back to publish it again")
				taskFailed(jt, m.Subject, err)
				continue
			}
			futs = append(futs, pending{jt, f, m, true})
		}
		for _, e := range jt.events {
			if jt.err != nil && !jt.wrote(e.write) {
				continue // the retry reports it
			}
			m, err := w.s.eventMsg(e)
			if err != nil {
				continue
			}
			f, err := w.s.js.PublishMsgAsync(m)
			if err != nil {
				w.log.Warn().Err(err).Str("kind", string(e.Kind)).Msg("event publish failed")
				continue
			}
			futs = append(futs, pending{jt, f, m, false})
		}
	}
	wctx, cancel := context.WithTimeout(ctx, w.s.cfg.WriteTimeout.Std())
	defer cancel()
	for _, p := range futs {
		select {
		case <-p.f.Ok():
		case err := <-p.f.Err():
			w.log.Warn().Err(err).Str("subject", p.msg.Subject).Msg("publish failed")
			if p.task {
				taskFailed(p.jt, p.msg.Subject, err)
			}
		case <-wctx.Done():
			w.log.Warn().Str("subject", p.msg.Subject).Msg("no PubAck in time")
			if p.task {
				taskFailed(p.jt, p.msg.Subject, wctx.Err())
			}
		}
	}
	for _, jt := range order {
		for _, c := range jt.controls {
			if jt.err != nil && !jt.wrote(c.write) {
				continue // the retry sends it
			}
			// An order, not a request: the agent's confirmation is its
			// result (cancelled); if none comes, the lease ends the step.
			_ = w.s.nc.Publish(c.subject, c.body)
		}
		if jt.err != nil {
			continue
		}
		for _, r := range jt.replies {
			_ = w.s.nc.Publish(r.to, r.body)
		}
	}
}

// finish settles a job's inputs after its writes: acknowledged, handed
// back for later (the job waits), or retried after a lost CAS.
func (w *worker) finish(jt *jobTurn) {
	if jt.err != nil {
		w.retry(jt)
		return
	}
	w.countLanded(jt, true)
	w.freeGates(jt)
	if jt.finished || jt.gone || (jt.js != nil && jt.js.job.State.Terminal()) {
		delete(w.cache, jt.id)
		w.dropWaiter(jt.id)
		delete(w.wakes, jt.id)
		delete(w.gated, jt.id)
		w.forgetDeadline(jt.id)
	}
	var msgs []jetstream.Msg
	for k, in := range jt.inputs {
		if in.req != nil {
			if t := jt.settle[k].term; t != "" {
				_ = in.req.Respond(protocol.ErrorReply(protocol.CodeNotFound, errors.New(t)))
			} else {
				_ = in.req.Respond(protocol.OKReply(""))
			}
		}
		msgs = append(msgs, in.held...)
		if in.msg != nil && jt.settle[k].term != "" {
			_ = in.msg.TermWithReason(jt.settle[k].term)
			continue
		}
		if in.msg != nil {
			msgs = append(msgs, in.msg)
		}
	}
	switch {
	case jt.more:
		// Not done dispatching: the messages ride along, so that a crash
		// before the job's dispatching is done redelivers them.
		for _, m := range msgs {
			_ = m.InProgress()
		}
		w.q.push(input{kind: inContinue, job: jt.id, held: msgs, at: w.s.now()})
	case jt.wait > 0:
		// Held, not handed back: a freed slot, a presence change, the
		// gate's own wake or retryAt brings the job back with its
		// messages. Handed back with a delay (as gates and backoffs were),
		// a message stays pending on its partition consumer all the same,
		// outside the hold budget: 4,096 jobs behind a rate limit stalled
		// every other job of their partition.
		now := w.s.now()
		wt, ok := w.waiting[jt.id]
		if !ok || wt.gate != !jt.agentWait {
			// A wait of another kind begins: one that waited an hour
			// behind a rate limit has not waited that long for an agent.
			wt.since = now
		}
		wt.gate = !jt.agentWait
		if !ok || jt.fresh {
			wt.readAt = now
		}
		wt.inFlight = jt.js.inFlight()
		wt.retryAt = now.Add(jt.wait)
		for _, in := range jt.inputs {
			if in.msg == nil || in.at.IsZero() {
				continue // held ones keep the waiter's extended
			}
			if wt.extended.IsZero() || in.at.Before(wt.extended) {
				wt.extended = in.at
			}
		}
		// Not all of them (holds.go): the record says what the job
		// waits for, and memory wakes it.
		wt.held = append(wt.held, w.s.holds.hold(jt.id, msgs)...)
		w.setWaiter(jt.id, wt)
	default:
		if jt.js != nil || jt.gone { // else the turn did not look at the job: its waiter stands
			w.dropWaiter(jt.id)
		}
		for _, m := range msgs {
			_ = m.Ack()
		}
	}
}

// retry drops the job's cached records (someone else wrote it) and puts its
// inputs back to be applied to a fresh read; after maxTries it hands the
// messages back to the stream.
func (w *worker) retry(jt *jobTurn) {
	w.countLanded(jt, false)
	w.freeGates(jt) // the steps whose records landed
	w.releaseAdmitted(jt)
	delete(w.cache, jt.id)
	conflict := errors.Is(jt.err, jobstore.ErrConflict) || errors.Is(jt.err, jobstore.ErrExists)
	// A record larger than one message is never written, however often
	// it is tried: the submission or result that made it is applied once
	// more as a refusal (handed back, it came back for ever, and the job
	// was never stored or its step never ended).
	tooLarge := errors.Is(jt.err, nats.ErrMaxPayload)
	// A submission only when the turn was creating the job: one of a job
	// that exists is a resubmission, and the record too large is the
	// job's, not its.
	creating := jt.js == nil || jt.js.jobRev == 0
	var again []input
	for _, in := range jt.inputs {
		in.tries++
		if in.tries < maxTries && conflict {
			again = append(again, in)
			continue
		}
		if tooLarge && in.tooLarge < tooLargeEvery && ((in.kind == inSubmit && creating) || in.kind == inResult) {
			w.log.Error().Err(jt.err).Str(logging.FieldJob, jt.id).Msg("a record is too large for one message: applying its input again as a refusal")
			in.tooLarge++
			again = append(again, in)
			continue
		}
		w.log.Warn().Err(jt.err).Str(logging.FieldJob, jt.id).Int("tries", in.tries).Msg("handling failed; handing the message back")
		// Soon, with jitter: a lost race is over in milliseconds; a store
		// error is retried on the consumer's schedule, not in a loop here.
		delay := conflictRetry + time.Duration(rand.Int64N(int64(conflictRetry)))
		if !conflict {
			delay = w.s.cfg.CapacityRetry.Std() * 5
		}
		for _, m := range in.held {
			_ = m.NakWithDelay(delay)
		}
		if in.msg != nil {
			_ = in.msg.NakWithDelay(delay)
		}
		if in.req != nil {
			_ = in.req.Respond(protocol.ErrorReply(protocol.CodeFailed, jt.err))
		}
	}
	if len(again) > 0 {
		w.q.pushFront(again...)
	}
}

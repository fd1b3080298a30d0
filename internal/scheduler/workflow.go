package scheduler

// Issue 13's features as the scheduler applies them: concurrency keys and
// named rate limits gate a step's dispatch (admit, releaseGates), and a
// submission that asks to start later is handed to the server's message
// schedule instead of being materialised now (delaySubmission).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/concurrency"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/internal/ratelimit"
	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// gates are the shared limits a step passes before it is dispatched.
type gates struct {
	conc *concurrency.Limiter
	rate *ratelimit.Limiter
	sub  *nats.Subscription // SubjectControlGateFreed

	// mu guards nextTry: per rate limit and base priority rank, the
	// next retry time handed out, so that steps refused by a limit come
	// back one after another rather than all at its next grant (a herd
	// that costs turns and grants), and before the lower steps refused
	// before them.
	mu      sync.Mutex
	nextTry map[string]*[4]time.Time
}

// rateRetry spreads the retries of steps refused by limit name: a step of
// priority p gets the later of the limiter's answer and the last one
// handed out to its priority or a higher one, plus half an emission
// interval (other schedulers compete for the same grants). The lines of
// lower priorities do not hold it back: a high step refused behind
// hundreds of low ones asks again at the limit's next grant, and low
// steps refused after it come back after it.
func (s *Scheduler) rateRetry(name string, p spec.Priority, at time.Time) time.Time {
	lim := s.cfg.RateLimits[name].WithDefaults()
	step := lim.Interval.Std() / time.Duration(2*lim.Limit)
	g := &s.gates
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.nextTry == nil {
		g.nextTry = map[string]*[4]time.Time{}
	}
	lines := g.nextTry[name]
	if lines == nil {
		lines = new([4]time.Time)
		g.nextTry[name] = lines
	}
	r := baseRank(p)
	for _, n := range lines[r:] {
		if n.After(at) {
			at = n
		}
	}
	lines[r] = at.Add(step)
	return at
}

// slotMargin is added to a step's lease to form its concurrency slot's
// lease: the slot outlives every moment the step's agent may still work.
const slotMargin = time.Second

// slotLease is how long a concurrency slot taken for st lasts.
func (w *worker) slotLease(st *jobstore.Step) time.Duration {
	return st.Timeout.Std() + w.s.cfg.DispatchGrace.Std() + slotMargin
}

// gateBudget bounds the time one turn spends on concurrency keys and rate
// limits (a round trip or a few each, more when schedulers contend for a
// key). The lease of a step dispatched in the turn runs from the turn's
// start, and its task is published at the turn's end: a turn that asked
// hundreds of queued steps about a key one after another published tasks
// after their deadlines (seen in TestConcurrencyKeyNeverOverlaps under
// load: every task reached its agent ~15 s late and was dead-lettered).
const gateBudget = 100 * time.Millisecond

// openGates creates the workflow stream and buckets and opens the limiters.
func (s *Scheduler) openGates(ctx context.Context) error {
	if err := streams.EnsureWorkflow(ctx, s.js, s.cfg.streamOptions()); err != nil {
		return err
	}
	conc, err := concurrency.New(ctx, s.js, concurrency.Config{Now: s.now}) // slot leases on the clock of step leases
	if err != nil {
		return err
	}
	rate, err := ratelimit.New(ctx, s.js, s.cfg.RateLimits)
	if err != nil {
		return err
	}
	// A freed slot's waiter may belong to another scheduler: tell them all;
	// the owner (the one caching the job) acts.
	sub, err := s.nc.Subscribe(protocol.SubjectControlGateFreed, func(m *nats.Msg) {
		if job := string(m.Data); protocol.ValidToken(job) {
			s.route(input{kind: inGateFreed, job: job, at: s.now()})
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", protocol.SubjectControlGateFreed, err)
	}
	s.gates.conc, s.gates.rate, s.gates.sub = conc, rate, sub
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				s.reportBacklog(now)
			}
		}
	}()
	return nil
}

func (s *Scheduler) closeGates() {
	if s.gates.sub != nil {
		_ = s.gates.sub.Unsubscribe()
	}
}

// holderID names a step as a concurrency-slot holder: the step, not the
// attempt, so that a re-dispatch renews its own slot.
func holderID(job, step string) string { return job + "." + step }

// admit takes the concurrency slots and the rate-limit grant step i needs.
// When it cannot, it gives back what it took and says when to look again
// and why (for the step's waiting field); fail is set when the step can
// never pass (unknownLimit), and dispatch fails it.
func (w *worker) admit(jt *jobTurn, i int, now time.Time) (ok bool, retryAt time.Time, why string, fail error) {
	sp := &jt.js.job.Spec
	ss := sp.Steps[i]
	keys := sp.StepConcurrency(ss)
	if len(keys) == 0 && ss.RateLimit == "" {
		return true, time.Time{}, "", nil
	}
	st := jt.js.steps[i]
	if jt.js.jobRev == 0 {
		// The job's records are not created yet (or this is a resubmission
		// of a job that exists): take nothing shared before the create has
		// landed. The job continues right after it.
		return false, now.Add(10 * time.Millisecond), st.Waiting, nil
	}
	holder := holderID(st.JobID, st.ID)
	prio := sp.StepPriority(ss) // as dispatch resolves it; keys and rate limits serve it without aging
	if until, ok := w.gated[st.JobID][st.ID]; ok && now.Before(until) {
		// Queued behind others (a concurrency key's queue, or its place
		// in a rate limit's line): a Release wakes it (gateFreed), or its
		// wake comes then.
		return false, until, st.Waiting, nil
	}
	if w.gateSpent >= gateBudget {
		// The turn spent its share on gates: a step admitted now would be
		// published at the end of a turn that has already eaten into its
		// lease, and every other job of this worker waits for the turn.
		// It asks again next turn.
		return false, now.Add(gateBudget), st.Waiting, nil
	}
	w.ungate(st.JobID, st.ID)
	ctx, cancel := context.WithTimeout(w.ctx, w.s.cfg.WriteTimeout.Std())
	defer cancel()
	defer func(start time.Time) { w.gateSpent += time.Since(start) }(time.Now())
	lease := w.slotLease(st)
	var held []gateGrant
	undo := func() { w.giveBackSlots(ctx, st, held) }
	for _, k := range keys {
		g, at, err := w.s.gates.conc.AcquireGrant(ctx, k.Key, k.Limit, holder, lease, prio)
		if err != nil {
			undo()
			return false, now.Add(w.s.cfg.CapacityRetry.Std()), jobstore.WaitingKeyError(k.Key, err), nil
		}
		if !g.Granted {
			undo()
			w.gate(st.JobID, st.ID, at)
			return false, at, fmt.Sprintf("%s %s (limit %d)", jobstore.WaitingForKey, k.Key, k.Limit), nil
		}
		held = append(held, gateGrant{key: k.Key, Grant: g})
	}
	if ss.RateLimit != "" {
		granted, at, err := w.s.gates.rate.Allow(ctx, ss.RateLimit, "")
		if errors.Is(err, ratelimit.ErrUnknownLimit) {
			undo()
			at, fail := w.unknownLimit(st, jobstore.WaitingLimitError(ss.RateLimit, err), err, now)
			return false, at, jobstore.WaitingLimitError(ss.RateLimit, err), fail
		}
		if err != nil {
			undo()
			return false, now.Add(w.s.cfg.CapacityRetry.Std()), jobstore.WaitingLimitError(ss.RateLimit, err), nil
		}
		if !granted {
			undo()
			// Its place in line holds until then: a turn before it (the
			// message's redelivery beside the wake) does not ask again.
			// Asking twice put the step in line twice, which stretched
			// the line and thinned the retries near its end, so grants
			// went unused while steps still waited.
			at = w.s.rateRetry(ss.RateLimit, prio, at)
			w.gate(st.JobID, st.ID, at)
			return false, at, jobstore.WaitingForRateLimit + " " + ss.RateLimit, nil
		}
	}
	jt.admitted = append(jt.admitted, i)
	if len(held) > 0 {
		if jt.grants == nil {
			jt.grants = map[int][]gateGrant{}
		}
		jt.grants[i] = held
	}
	return true, time.Time{}, "", nil
}

// DefaultUnknownLimitGrace is how long a step waits on a rate limit its
// scheduler does not define before it fails (WithUnknownLimitGrace).
// Submission refuses such a name, so a step meets one only when the
// schedulers' configurations differ or changed since: during a rolling
// deploy that adds the limit an old scheduler may hold the job until a
// new one takes its partition, which the grace covers; a limit removed
// from the configuration never comes back, and the step then fails once
// the grace has passed instead of waiting for ever.
const DefaultUnknownLimitGrace = 5 * time.Minute

// unknownLimit decides for a step whose rate limit this scheduler does not
// define (why: its waiting reason): wait, and when to look again, or fail
// once it has waited so for the grace. The wait is counted from when the
// step's waiting field first said so (its updated_at then), as stored,
// so it holds across schedulers and restarts.
func (w *worker) unknownLimit(st *jobstore.Step, why string, err error, now time.Time) (time.Time, error) {
	grace := w.s.unknownLimitGrace
	if st.Waiting == why {
		if deadline := st.UpdatedAt.Add(grace); !now.Before(deadline) {
			return time.Time{}, fmt.Errorf("%w: not in the scheduler's rate_limits for %s", err, grace)
		}
		return minTime(st.UpdatedAt.Add(grace), now.Add(w.s.cfg.WaitRetry.Std())), nil
	}
	return now.Add(min(grace, w.s.cfg.WaitRetry.Std())), nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// gateGrant is a concurrency slot a turn took for a step.
type gateGrant struct {
	key string
	concurrency.Grant
}

// giveBackSlots releases the slots a turn took for st and did not use,
// each only if this turn added it and nobody renewed it since. A freed
// slot wakes the job on every scheduler, and the holder is the step's id,
// so a second scheduler asking for it is granted the first's slot as a
// renewal; released unconditionally when its own dispatch then lost (the
// job record's compare-and-set, no agent), it was the slot the winner's
// step ran on, and the key's limit was exceeded (two schedulers, a limit
// of 1: 65 of 80 runs overlapped another). A slot kept so is freed by its
// lease if nobody uses it. A slot this turn only renewed gets its lease
// back (GiveBack): a step taken back from a dead agent renewed it at every
// try while it waited for an agent, and held the key for as long.
func (w *worker) giveBackSlots(ctx context.Context, st *jobstore.Step, grants []gateGrant) {
	for _, g := range grants {
		next, err := w.s.gates.conc.GiveBack(ctx, g.key, holderID(st.JobID, st.ID), g.Grant)
		if err != nil {
			w.log.Warn().Err(err).Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Str("key", g.key).
				Bool("renewal", g.Renewed).Msg("concurrency slot not given back; its lease will free it")
			continue
		}
		w.wakeWaiters(next)
	}
}

// wakeWaiters wakes the jobs whose steps freed slots now belong to.
func (w *worker) wakeWaiters(next []string) {
	for _, h := range next {
		if job, _, ok := strings.Cut(h, "."); ok {
			_ = w.s.nc.Publish(protocol.SubjectControlGateFreed, []byte(job))
		}
	}
}

// releaseAdmitted gives back what a turn took for dispatches whose writes
// did not land (a lost compare-and-set): the retry admits again. A step
// whose own record landed keeps its gates: its task was published
// (worker.publish), it runs, and its slot is released by its result.
func (w *worker) releaseAdmitted(jt *jobTurn) {
	if jt.js == nil {
		return
	}
	for _, i := range jt.admitted {
		if jt.landed[i] || (jt.js.job.Inline && jt.landed[-1]) {
			continue
		}
		if jt.unsure[i] || (jt.js.job.Inline && jt.unsure[-1]) {
			// Given back, a dispatch that did land would run without its
			// slot when its task is published again on the reload, and the
			// key's limit be exceeded; kept, a slot whose write did not
			// land is freed by its lease, and the step's retry takes it
			// again as the same holder.
			continue
		}
		w.giveBack(jt, i)
	}
	jt.admitted = nil
}

// unadmit gives back what step i was admitted with in this turn when it is
// not dispatched after all (no agent took it).
func (w *worker) unadmit(jt *jobTurn, i int) {
	k := slices.Index(jt.admitted, i)
	if k < 0 {
		return
	}
	jt.admitted = slices.Delete(jt.admitted, k, k+1)
	w.giveBack(jt, i)
}

// giveBack releases step i's concurrency slots and returns its rate-limit
// grant, for a step admitted but never dispatched: a grant kept then was
// lost, and under a steady backlog the limit ran below its rate (in
// TestRateLimitAcrossSchedulers 50–90 of ~650 grants were lost so, mostly
// to dispatches of a scheduler whose cached job was stale).
func (w *worker) giveBack(jt *jobTurn, i int) {
	ctx, cancel := context.WithTimeout(w.ctx, w.s.cfg.WriteTimeout.Std())
	defer cancel()
	w.giveBackSlots(ctx, jt.js.steps[i], jt.grants[i])
	delete(jt.grants, i)
	name := jt.js.job.Spec.Steps[i].RateLimit
	if name == "" {
		return
	}
	if err := w.s.gates.rate.Return(ctx, name, ""); err != nil {
		st := jt.js.steps[i]
		w.log.Warn().Err(err).Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Str("rate_limit", name).
			Msg("unused rate-limit grant not returned")
	}
}

// freeGates gives back, once a turn's writes landed, the concurrency
// slots of the steps that ended or went back to wait in it (jt.freed), and
// their places in keys' queues. Not before: a result judged on a stale
// copy of its job (another scheduler dispatched the step again) freed the
// slot the new dispatch ran on, and the write then found the copy stale.
//
// A turn whose writes failed after some landed (retry) frees the steps
// whose own record landed: that compare-and-set proved the copy current,
// and the result applied again finds its step ended (alreadyApplied) and
// frees nothing, so the slot waited for its lease. A step dispatched again
// in the same turn (a retry without backoff) keeps the slot it renewed.
func (w *worker) freeGates(jt *jobTurn) {
	if jt.js == nil {
		return
	}
	slices.Sort(jt.freed)
	for _, i := range slices.Compact(jt.freed) {
		landed := jt.err == nil || jt.landed[i] || (jt.js.job.Inline && jt.landed[-1])
		if landed && jt.js.steps[i].State != jobstore.StepDispatched {
			w.releaseGates(jt, i)
		}
	}
	jt.freed = nil
}

// freeIfQueued marks pending step i, ending unrun (cancelled, expired),
// for freeGates when it may wait in a concurrency key's queue
// (queuedForKey): only those, as giving back every pending step of a large
// cancelled job was a round trip each, inside the worker's turn.
func (w *worker) freeIfQueued(jt *jobTurn, i int) {
	if w.queuedForKey(jt, i) {
		jt.freed = append(jt.freed, i)
	}
}

// queuedForKey says whether pending step i may wait in a concurrency key's
// queue: its record says so, or this worker told it to wait there.
func (w *worker) queuedForKey(jt *jobTurn, i int) bool {
	st := jt.js.steps[i]
	if strings.HasPrefix(st.Waiting, jobstore.WaitingForKey) {
		return true
	}
	_, ok := w.gated[st.JobID][st.ID]
	return ok
}

// maxFreedOnAdvance bounds the slots one advance gives back for steps that
// ended elsewhere; the leases of any others free them.
const maxFreedOnAdvance = 64

// endedElsewhere marks for freeGates the steps of an advanced job that
// ended without a result this scheduler applied: parked in the DLQ, or
// ended cancelled by the supervisor (it sends the advance). Their slots
// were freed only by their leases (the step's timeout, its dispatch grace
// and a second after the last admit: 5 m 31 s by default) while every
// other job on the key waited. Steps that ended longer ago than a slot's
// lease hold nothing any more; a succeeded step gave its slot back with
// its result; giving back a slot not held changes nothing.
func (w *worker) endedElsewhere(jt *jobTurn, now time.Time) {
	if !slices.ContainsFunc(jt.inputs, func(in input) bool { return in.kind == inAdvance }) {
		return
	}
	js := jt.js
	n := 0
	for i, st := range js.steps {
		if n == maxFreedOnAdvance {
			return
		}
		if !st.State.Terminal() || st.State == jobstore.StepSucceeded ||
			len(js.job.Spec.StepConcurrency(js.job.Spec.Steps[i])) == 0 {
			continue
		}
		ended := st.FinishedAt
		if ended.IsZero() {
			ended = st.UpdatedAt
		}
		if now.Sub(ended) > w.slotLease(st) {
			continue
		}
		jt.freed = append(jt.freed, i)
		n++
	}
}

// releaseGates gives back step i's concurrency slots (and its place in
// their queues), and wakes the jobs whose steps the freed slots now belong
// to (freeGates; a dispatch that did not land gives its own back:
// giveBackSlots).
func (w *worker) releaseGates(jt *jobTurn, i int) {
	sp := &jt.js.job.Spec
	keys := sp.StepConcurrency(sp.Steps[i])
	if len(keys) == 0 {
		return
	}
	st := jt.js.steps[i]
	ctx, cancel := context.WithTimeout(w.ctx, w.s.cfg.WriteTimeout.Std())
	defer cancel()
	for _, k := range keys {
		next, err := w.s.gates.conc.Release(ctx, k.Key, holderID(st.JobID, st.ID))
		if err != nil {
			// The slot's lease frees it; waiters retry by then.
			w.log.Warn().Err(err).Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Str("key", k.Key).
				Msg("concurrency slot not released; its lease will free it")
			continue
		}
		w.wakeWaiters(next)
	}
}

// gateFreed forgets that job's steps wait in a concurrency queue, so that
// the wake that follows asks the key again; the job is always woken. A job this worker has not cached (dropped after a lost race,
// or owned by another scheduler) is read afresh; skipping it lost the wake
// and left the key with waiters and no holder. Two schedulers waking the
// same job is safe: the key's compare-and-set admits one step, the job
// record's admits one dispatch, and results are judged against the stored
// job.
func (w *worker) gateFreed(job string) { delete(w.gated, job) }

// gate notes that step of job waits in a gate's queue until until.
func (w *worker) gate(job, step string, until time.Time) {
	g := w.gated[job]
	if g == nil {
		g = map[string]time.Time{}
		w.gated[job] = g
	}
	g[step] = until
}

// ungate forgets that step of job waits in a gate's queue.
func (w *worker) ungate(job, step string) {
	if g := w.gated[job]; g != nil {
		if delete(g, step); len(g) == 0 {
			delete(w.gated, job)
		}
	}
}

// gateMinWait is the least wait before a gated job's waiter's retryAt:
// its wake (wakeAt) retries it on time, and retryAt is only the fallback.
const gateMinWait = time.Second

// wakeAt retries a job held back by a gate at the time the gate named: a
// rate limit's next grant is known to the millisecond, and waiting for the
// message's redelivery would waste grants. A job gets one timer: a wake
// already due no later than at is enough (a gated job passes through
// dispatch on every wake and redelivery, and a timer per pass multiplied
// into wake storms).
func (w *worker) wakeAt(job string, at time.Time) {
	now := w.s.now()
	if due, ok := w.wakes[job]; ok && due.After(now) && !at.Before(due) {
		return
	}
	w.wakes[job] = at
	time.AfterFunc(max(at.Sub(now), 0), func() {
		w.q.push(input{kind: inWake, job: job, at: w.s.now()})
	})
}

// checkRateLimits refuses a spec naming a rate limit this scheduler does
// not define.
func (s *Scheduler) checkRateLimits(sp *spec.Job) error {
	for i, st := range sp.Steps {
		if st.RateLimit != "" && !s.gates.rate.Known(st.RateLimit) {
			return &spec.ValidationError{Reason: spec.ReasonInvalidValue, Field: fmt.Sprintf("steps[%d].rate_limit", i),
				Msg: fmt.Sprintf("no rate limit named %q in the scheduler's rate_limits", st.RateLimit)}
		}
	}
	return nil
}

// delaySubmission hands a submission whose spec starts later (run_at,
// delay) to a message schedule on warden.delay.<job> in WARDEN_DELAY,
// which the server releases at that time and a delay relay submits again
// (schedule.RunDelayRelay); it reports whether it did. A released
// submission is never delayed again. Every delayed submission comes this
// way: only schedulers write WARDEN_DELAY (docs/security.md, roll-ups).
func (s *Scheduler) delaySubmission(ctx context.Context, in *input, sp *spec.Job) (bool, error) {
	h := in.msg.Headers()
	if schedule.Released(h) {
		return false, nil
	}
	submitted := s.now()
	if md, err := in.msg.Metadata(); err == nil {
		submitted = md.Timestamp
	}
	at := sp.StartAt(submitted)
	if !at.After(s.now()) {
		return false, nil
	}
	m := schedule.Resubmission(in.job, in.msg.Data(), h)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout.Std())
	defer cancel()
	if _, err := schedule.PublishDelayed(ctx, s.js, m, at); err != nil {
		return false, fmt.Errorf("delay job %s until %s: %w", in.job, at.Format(time.RFC3339), err)
	}
	s.log.Info().Str(logging.FieldJob, in.job).Time("run_at", at).Msg("submission delayed")
	return true, nil
}

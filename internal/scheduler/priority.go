package scheduler

// Priorities under backlog (issue 13). When agents are at capacity, steps
// wait; a step does not take a freed slot while a step of a higher
// effective priority waits for the same pool in this scheduler, so the
// higher one gets the next slot. Effective priority ages: one level up per
// PriorityAging waited (spec.Priority.EffectiveRank), so a low step under a
// steady stream of high work waits at most 3 × PriorityAging before it
// competes as critical — the guard against starvation. The order holds
// within one scheduler process; schedulers do not share their queues.
//
// Two things make the order hold rather than usually hold:
//   - A step's last look at the backlog and its taking of a slot are one
//     step under the backlog's lock (take), and a step that finds no free
//     slot is registered as waiting in that same step. Before, a low step
//     could look (nothing higher waits), a high step find no slot and
//     register, a slot free, and the low step take it.
//   - A submission is registered when the scheduler receives it (arrived),
//     not when its worker first gets to it: its worker may be busy with a
//     turn while another worker handles a low job submitted after it.
//     This is done only while steps wait for the pool (a backlog), where
//     order matters; without one, nothing is parsed twice.

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/internal/selection"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// waitStale: a waiting entry not refreshed for this long is ignored (its
// step was cancelled, expired, or moved to another scheduler). Waiting
// steps refresh theirs on every retry (CapacityRetry, wakes).
const waitStale = 5 * time.Second

// errBehind says a step did not compete for a slot: a step of higher
// effective priority waits for an agent it would get.
var errBehind = errors.New(jobstore.WaitingBehind)

type waitEntry struct {
	pool        string
	class       slotClass
	priority    spec.Priority
	since, seen time.Time
}

// slotClass is what a step needs of an agent: what the selector would be
// asked (its pool, action, required capabilities, pinned agent). A step is
// behind only the waiting work of higher priority that could use the
// agent it would get: a high step waiting for busy gpu agents held back
// every lower step of the pool before, and an idle agent without a gpu
// stayed idle until they had aged past it (3 × aging). any (a cluster
// step, whose member its router picks) fits every agent.
type slotClass struct {
	req selection.Request
	any bool
}

func (c slotClass) key() string {
	if c.any {
		return "\x01"
	}
	return c.req.Agent + "\x00" + c.req.Action + "\x00" + strings.Join(c.req.Requires, "\x00")
}

// fits reports whether a step of class c could run on p.
func (c slotClass) fits(p *protocol.Presence) bool { return c.any || c.req.Matches(p) }

// classWait counts the waiting steps of one class by base rank.
type classWait struct {
	class  slotClass
	counts [4]int
}

// backlog is the steps of this scheduler waiting for agent capacity,
// counted by pool, class (few per pool: the distinct actions and
// requirements that wait) and base priority, so that a dispatch checks in
// a few steps whether higher work waits and whether it could use an agent.
type backlog struct {
	mu      sync.Mutex
	entries map[string]*waitEntry            // by holderID
	classes map[string]map[string]*classWait // pool → class key → waiting steps
}

// waitsLocked reports whether a step of a base rank in [lo, hi) waits for
// pool, of a class fit accepts (nil: any).
func (b *backlog) waitsLocked(pool string, lo, hi int, fit func(slotClass) bool) bool {
	for _, cw := range b.classes[pool] {
		if slices.ContainsFunc(cw.counts[min(lo, hi):hi], func(n int) bool { return n > 0 }) && (fit == nil || fit(cw.class)) {
			return true
		}
	}
	return false
}

// rank is a step's effective rank after waiting since since.
func (s *Scheduler) rank(p spec.Priority, since, now time.Time) int {
	return p.EffectiveRank(now.Sub(since), s.cfg.PriorityAging.Std())
}

// baseRank is p's rank before aging (an unknown priority: normal's, as
// EffectiveRank and the concurrency limiter rank it).
func baseRank(p spec.Priority) int { return p.RankOrNormal() }

// behind reports whether a step of higher priority than holder's (its
// priority p, aged by its own wait) waits for an agent of pool that holder
// would get (peek names it; nil or an error: any higher step waiting for
// the pool counts); if so, holder is registered as waiting too. Others are
// counted at their base priority: aging lifts the one that waits, which is
// what keeps it from starving.
func (s *Scheduler) behind(holder, pool string, class slotClass, p spec.Priority, now time.Time,
	peek func() (protocol.Presence, error)) bool {
	b := &s.backlog
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := s.behindLocked(holder, pool, p, now, peek); !ok {
		return false
	}
	b.waitLocked(holder, pool, class, p, now)
	return true
}

// behindLocked reports whether higher work waits for what holder would
// get; if not, agent is the agent peek named when higher work waits for
// the pool at all (the one holder may take), else "".
func (s *Scheduler) behindLocked(holder, pool string, p spec.Priority, now time.Time,
	peek func() (protocol.Presence, error)) (agent string, behind bool) {
	b := &s.backlog
	since := now
	if e := b.entries[holder]; e != nil {
		since = e.since
	}
	from := min(s.rank(p, since, now)+1, 4)
	if !b.waitsLocked(pool, from, 4, nil) {
		return "", false
	}
	if peek == nil {
		return "", true
	}
	a, err := peek()
	if err != nil || b.waitsLocked(pool, from, 4, func(c slotClass) bool { return c.fits(&a) }) {
		return "", true
	}
	return a.ID, false
}

// take is a step's bid for a slot in pool: unless a step of higher
// priority waits for the agent it would get (errBehind), choose takes the
// slot — on the agent peek named when higher work waits for the pool, so
// that the step takes no agent that work could use. A step that finds
// every agent at capacity, or is behind, is registered as waiting; one
// that got an agent, or can wait for none of this pool's slots (no agent
// offers its action), is not. All of it happens under the backlog's lock,
// so no step of higher priority registers between a step's look and its
// taking the slot. peek and choose must not block (the selector and the
// cluster router answer from memory).
func (s *Scheduler) take(holder, pool string, class slotClass, p spec.Priority, now time.Time,
	peek func() (protocol.Presence, error), choose func(agent string) (protocol.Presence, error)) (protocol.Presence, error) {
	b := &s.backlog
	b.mu.Lock()
	defer b.mu.Unlock()
	on, behind := s.behindLocked(holder, pool, p, now, peek)
	if behind {
		b.waitLocked(holder, pool, class, p, now)
		return protocol.Presence{}, errBehind
	}
	agent, err := choose(on)
	if errors.Is(err, selection.ErrAtCapacity) {
		b.waitLocked(holder, pool, class, p, now)
	} else {
		b.forgetLocked(holder)
	}
	return agent, err
}

// waitLocked records that holder waits for capacity in pool.
func (b *backlog) waitLocked(holder, pool string, class slotClass, p spec.Priority, now time.Time) {
	if b.entries == nil {
		b.entries, b.classes = map[string]*waitEntry{}, map[string]map[string]*classWait{}
	}
	e := b.entries[holder]
	if e == nil {
		e = &waitEntry{pool: pool, class: class, priority: p, since: now}
		b.entries[holder] = e
		b.countLocked(e, 1)
	}
	e.seen = now
}

// countLocked adds d to the count of e's class.
func (b *backlog) countLocked(e *waitEntry, d int) {
	r := baseRank(e.priority)
	classes := b.classes[e.pool]
	if classes == nil {
		classes = map[string]*classWait{}
		b.classes[e.pool] = classes
	}
	k := e.class.key()
	cw := classes[k]
	if cw == nil {
		cw = &classWait{class: e.class}
		classes[k] = cw
	}
	cw.counts[r] += d
	if cw.counts == [4]int{} {
		delete(classes, k)
	}
}

// stopWaiting forgets holder: ended, or waiting for something other than
// a slot (a backoff, its job's share, a gate), which must not hold back
// lower work that can use the slot. Lower steps it held back are woken: a
// slot may be free for them now.
func (s *Scheduler) stopWaiting(holder string) {
	b := &s.backlog
	b.mu.Lock()
	heldBack := b.forgetLocked(holder)
	b.mu.Unlock()
	if heldBack {
		s.wakeAll()
	}
}

// forgetLocked drops holder's entry and reports whether steps of lower
// base priority wait for its pool.
func (b *backlog) forgetLocked(holder string) (heldBack bool) {
	e := b.entries[holder]
	if e == nil {
		return false
	}
	b.countLocked(e, -1)
	delete(b.entries, holder)
	return b.waitsLocked(e.pool, 0, baseRank(e.priority), nil)
}

// arrived registers, as the scheduler receives a submission, its steps
// that are ready at once in the backlog of pools where steps wait: a step
// of lower priority submitted after it, handled first by another worker,
// is then behind it. Submissions that will not run now (rejected,
// delayed) are not registered; a registered step that does not compete
// for a slot after all (its job existed and the step is done, a gate
// holds it) is forgotten by its job's turn (dispatch), and stale ones by
// reportBacklog.
func (s *Scheduler) arrived(in *input) {
	b := &s.backlog
	b.mu.Lock()
	busy := len(b.entries) > 0
	b.mu.Unlock()
	if !busy || in.msg == nil {
		return
	}
	if md, err := in.msg.Metadata(); err == nil && md.NumDelivered > 1 {
		// A redelivery: its job was handled already (it waits, or its
		// scheduler died); its turn registers what waits.
		return
	}
	sp, err := s.parseSubmission(in)
	if err != nil || s.checkRateLimits(sp) != nil {
		return // its turn rejects it
	}
	if h := in.msg.Headers(); !schedule.Released(h) {
		submitted := in.at
		if md, err := in.msg.Metadata(); err == nil {
			submitted = md.Timestamp
		}
		if sp.StartAt(submitted).After(in.at) {
			return // delayed (delaySubmission)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, st := range sp.Steps {
		if len(st.DependsOn) > 0 || st.Cluster != "" {
			continue // not ready yet; a cluster's pool is known when routed
		}
		pool := st.PoolOrDefault()
		if !b.waitsLocked(pool, 0, 4, nil) {
			continue // no backlog in the pool: nothing to be ahead of
		}
		class := slotClass{req: selection.Request{Pool: pool, Agent: st.Agent, Action: st.Action, Requires: st.Requires}}
		b.waitLocked(holderID(in.job, st.ID), pool, class, sp.StepPriority(st), in.at)
	}
}

// reportBacklog drops stale entries (steps cancelled, expired or moved
// while they waited), recounts, and sets the queue-depth gauge by priority.
func (s *Scheduler) reportBacklog(now time.Time) {
	b := &s.backlog
	b.mu.Lock()
	n := [4]int{}
	if b.entries != nil {
		b.classes = map[string]map[string]*classWait{}
	}
	for h, e := range b.entries {
		if now.Sub(e.seen) > waitStale {
			delete(b.entries, h)
			continue
		}
		b.countLocked(e, 1)
		n[baseRank(e.priority)]++
	}
	b.mu.Unlock()
	for _, p := range spec.Priorities {
		s.metrics.WaitingSteps(string(p), n[baseRank(p)])
	}
}

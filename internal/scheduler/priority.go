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
	"sync"
	"time"

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
// effective priority waits for its pool.
var errBehind = errors.New("behind higher-priority work")

type waitEntry struct {
	pool        string
	priority    spec.Priority
	since, seen time.Time
}

// backlog is the steps of this scheduler waiting for agent capacity, with
// counts per pool and base priority so that a dispatch checks in O(1).
type backlog struct {
	mu      sync.Mutex
	entries map[string]*waitEntry // by holderID
	counts  map[string]*[4]int    // pool → waiting steps by base rank
}

// rank is a step's effective rank after waiting since since.
func (s *Scheduler) rank(p spec.Priority, since, now time.Time) int {
	return p.EffectiveRank(now.Sub(since), s.cfg.PriorityAging.Std())
}

func baseRank(p spec.Priority) int { return max(p.Rank(), 0) }

// behind reports whether a step of higher priority than holder's (its
// priority p, aged by its own wait) waits for pool; if so, holder is
// registered as waiting too. Others are counted at their base priority:
// aging lifts the one that waits, which is what keeps it from starving.
func (s *Scheduler) behind(holder, pool string, p spec.Priority, now time.Time) bool {
	b := &s.backlog
	b.mu.Lock()
	defer b.mu.Unlock()
	if !s.behindLocked(holder, pool, p, now) {
		return false
	}
	b.waitLocked(holder, pool, p, now)
	return true
}

func (s *Scheduler) behindLocked(holder, pool string, p spec.Priority, now time.Time) bool {
	b := &s.backlog
	c := b.counts[pool]
	if c == nil {
		return false
	}
	since := now
	if e := b.entries[holder]; e != nil {
		since = e.since
	}
	for r := s.rank(p, since, now) + 1; r < len(c); r++ {
		if c[r] > 0 {
			return true
		}
	}
	return false
}

// take is a step's bid for a slot in pool: unless a step of higher
// priority waits for the pool (errBehind), choose picks the agent. A step
// that finds every agent at capacity, or is behind, is registered as
// waiting; one that got an agent, or can wait for none of this pool's
// slots (no agent offers its action), is not. All of it happens under the
// backlog's lock, so no step of higher priority registers between a
// step's look and its taking the slot. choose must not block (the
// selector and the cluster router answer from memory).
func (s *Scheduler) take(holder, pool string, p spec.Priority, now time.Time,
	choose func() (protocol.Presence, error)) (protocol.Presence, error) {
	b := &s.backlog
	b.mu.Lock()
	defer b.mu.Unlock()
	if s.behindLocked(holder, pool, p, now) {
		b.waitLocked(holder, pool, p, now)
		return protocol.Presence{}, errBehind
	}
	agent, err := choose()
	if errors.Is(err, selection.ErrAtCapacity) {
		b.waitLocked(holder, pool, p, now)
	} else {
		b.forgetLocked(holder)
	}
	return agent, err
}

// waitLocked records that holder waits for capacity in pool.
func (b *backlog) waitLocked(holder, pool string, p spec.Priority, now time.Time) {
	if b.entries == nil {
		b.entries, b.counts = map[string]*waitEntry{}, map[string]*[4]int{}
	}
	e := b.entries[holder]
	if e == nil {
		e = &waitEntry{pool: pool, priority: p, since: now}
		b.entries[holder] = e
		if b.counts[pool] == nil {
			b.counts[pool] = &[4]int{}
		}
		b.counts[pool][baseRank(p)]++
	}
	e.seen = now
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
	c := b.counts[e.pool]
	r := baseRank(e.priority)
	c[r]--
	delete(b.entries, holder)
	for lower := range r {
		if c[lower] > 0 {
			return true
		}
	}
	return false
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
		c := b.counts[pool]
		if c == nil || *c == [4]int{} {
			continue // no backlog in the pool: nothing to be ahead of
		}
		b.waitLocked(holderID(in.job, st.ID), pool, sp.StepPriority(st), in.at)
	}
}

// reportBacklog drops stale entries (steps cancelled, expired or moved
// while they waited), recounts, and sets the queue-depth gauge by priority.
func (s *Scheduler) reportBacklog(now time.Time) {
	b := &s.backlog
	b.mu.Lock()
	n := [4]int{}
	counts := map[string]*[4]int{}
	for h, e := range b.entries {
		if now.Sub(e.seen) > waitStale {
			delete(b.entries, h)
			continue
		}
		if counts[e.pool] == nil {
			counts[e.pool] = &[4]int{}
		}
		counts[e.pool][baseRank(e.priority)]++
		n[baseRank(e.priority)]++
	}
	if b.entries != nil {
		b.counts = counts
	}
	b.mu.Unlock()
	for _, p := range spec.Priorities {
		s.metrics.WaitingSteps(string(p), n[baseRank(p)])
	}
}

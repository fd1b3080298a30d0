package scheduler

// Priorities under backlog (issue 13). When agents are at capacity, steps
// wait; a step does not take a freed slot while a step of a higher
// effective priority waits for the same pool in this scheduler, so the
// higher one gets the next slot. Effective priority ages: one level up per
// PriorityAging waited (spec.Priority.EffectiveRank), so a low step under a
// steady stream of high work waits at most 3 × PriorityAging before it
// competes as critical — the guard against starvation. The order holds
// within one scheduler process; schedulers do not share their queues.

import (
	"sync"
	"time"

	"github.com/wardenhq/warden/pkg/spec"
)

// waitStale: a waiting entry not refreshed for this long is ignored (its
// step was cancelled, expired, or moved to another scheduler). Waiting
// steps refresh theirs on every retry (CapacityRetry, wakes).
const waitStale = 5 * time.Second

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
// priority p, aged by its own wait) waits for pool. Others are counted at
// their base priority: aging lifts the one that waits, which is what keeps
// it from starving.
func (s *Scheduler) behind(holder, pool string, p spec.Priority, now time.Time) bool {
	b := &s.backlog
	b.mu.Lock()
	defer b.mu.Unlock()
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

// waiting records that holder waits for capacity in pool.
func (s *Scheduler) waiting(holder, pool string, p spec.Priority, now time.Time) {
	b := &s.backlog
	b.mu.Lock()
	defer b.mu.Unlock()
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

// stopWaiting forgets holder (dispatched).
func (s *Scheduler) stopWaiting(holder string) {
	b := &s.backlog
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entries[holder]; e != nil {
		b.counts[e.pool][baseRank(e.priority)]--
		delete(b.entries, holder)
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

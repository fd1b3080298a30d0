package selection

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/pkg/protocol"
)

// This file is the selector's index of present agents. It is maintained
// incrementally by Observe, Forget, Release, SetHealth and ClearHealth, so
// that a decision looks agents up instead of scanning the fleet:
//
//   - entries: agent key → entry, for pinned steps and for updates, O(1);
//   - sets: one per pool, per (pool, action), per (pool, capability) and per
//     (pool, label=value). Each set keeps its members sorted by id (for
//     round_robin and standby, and for the exact evaluation of small sets)
//     and, separately and unordered, its open members — eligible and not at
//     capacity — that untargeted decisions sample from.
//
// An agent belongs to 1 + actions + capabilities + labels sets; keeping
// them up to date costs that many small updates per change, and a join or
// leave one sorted insertion or deletion per set.

// offlineMemory is how long an action offered by an agent that left keeps
// a step for it waiting rather than failing as unknown: an agent that
// restarts, or the only agent of a heterogeneous pool offering an action
// being offline for a while, must not fail its steps.
const offlineMemory = 24 * time.Hour

// setKind tells what a set groups agents by.
type setKind uint8

const (
	kindPool setKind = iota
	kindAction
	kindCapability
	kindLabel
)

// setKey names a set: the agents of pool with the action, capability or
// label name=value.
type setKey struct {
	kind        setKind
	pool        string
	name, value string
}

// set is a group of agents of one pool.
type set struct {
	all      []*entry // sorted by id
	open     []*entry // eligible and not full; unordered
	eligible int      // members neither draining nor excluded by health
	// draining counts the draining members: with eligible and the member
	// count it says, without a walk, why a step waits (see noneEligible).
	draining int
	// capacity is the sum of the eligible members' max_concurrent (at
	// least 1 each), kept as they join, leave and change, so that Capacity,
	// which the scheduler asks for every step of a multi-step job, is one
	// lookup instead of a walk over every agent offering the action.
	capacity int
	// view marks the set of an affinity view (view.go): not in s.sets,
	// its members found through their presence, not keysOf.
	view bool
}

// membership is an entry's place in one set.
type membership struct {
	s      *set
	openAt int // index in s.open, -1 when not open
}

// entry is what the selector knows of one present agent.
type entry struct {
	key agentKey
	p   protocol.Presence
	c   counts
	// health, when assessed.
	h        health.Assessment
	assessed bool
	factor   float64
	eligible bool // not draining, health factor above 0
	draining bool // as counted in its sets' draining (refresh)
	open     bool // eligible and not full
	// slots is what the agent adds to each of its sets' capacity: its
	// capacity() while eligible, else 0. refresh keeps it current; join
	// and leave add and subtract exactly this, so the sums never drift.
	slots int
	sets  []membership
}

// used is the agent's load: its reported in_flight plus what this selector
// assigned since that heartbeat, minus what finished since.
func (e *entry) used() int { return max(0, e.c.inFlight+e.c.assigned-e.c.released) }

// capacity is max_concurrent, at least 1.
func (e *entry) capacity() int { return max(e.c.maxConcurrent, 1) }

func (e *entry) full() bool { return e.used() >= e.capacity() }

func (e *entry) offers(action string) bool { return slices.Contains(e.p.Actions, action) }

func byID(a *entry, id string) int { return cmp.Compare(a.p.ID, id) }

// keysOf lists the sets an agent with presence p belongs to.
func keysOf(p *protocol.Presence) []setKey {
	keys := make([]setKey, 0, 1+len(p.Actions)+len(p.Capabilities)+len(p.Labels))
	keys = append(keys, setKey{kind: kindPool, pool: p.Pool})
	for _, a := range p.Actions {
		keys = append(keys, setKey{kind: kindAction, pool: p.Pool, name: a})
	}
	for _, c := range p.Capabilities {
		keys = append(keys, setKey{kind: kindCapability, pool: p.Pool, name: c})
	}
	for _, k := range slices.Sorted(maps.Keys(p.Labels)) {
		keys = append(keys, setKey{kind: kindLabel, pool: p.Pool, name: k, value: p.Labels[k]})
	}
	// An agent listing an action twice is in its set once.
	slices.SortFunc(keys, func(a, b setKey) int {
		return cmp.Or(cmp.Compare(a.kind, b.kind), cmp.Compare(a.name, b.name), cmp.Compare(a.value, b.value))
	})
	return slices.Compact(keys)
}

// sameSets reports whether presences a and b put an agent in the same sets.
func sameSets(a, b *protocol.Presence) bool {
	return a.Pool == b.Pool && slices.Equal(a.Actions, b.Actions) &&
		slices.Equal(a.Capabilities, b.Capabilities) && maps.Equal(a.Labels, b.Labels)
}

// join adds e to the sets its presence names, and to the affinity views
// of its pool whose query it matches.
func (s *Selector) join(e *entry) {
	s.pruneDeparted()
	for _, k := range keysOf(&e.p) {
		st, ok := s.sets[k]
		if !ok {
			st = &set{}
			s.sets[k] = st
		}
		enter(st, e)
		if k.kind == kindAction {
			s.offered(e.p.Pool)[k.name]++
		}
	}
	for _, v := range s.views[e.p.Pool] {
		if v.admits(e) {
			enter(&v.set, e)
		}
	}
}

// enter adds e to st: to its members, counts and (when e is open) open
// list.
func enter(st *set, e *entry) {
	i, _ := slices.BinarySearchFunc(st.all, e.p.ID, byID)
	st.all = slices.Insert(st.all, i, e)
	m := membership{s: st, openAt: -1}
	if e.eligible {
		st.eligible++
	}
	if e.draining {
		st.draining++
	}
	st.capacity += e.slots
	if e.open {
		m.openAt = len(st.open)
		st.open = append(st.open, e)
	}
	e.sets = append(e.sets, m)
}

// leave removes e from every set it is in; empty sets are dropped (empty
// views are kept: agents may match them again).
func (s *Selector) leave(e *entry) {
	for _, k := range keysOf(&e.p) {
		st := s.sets[k]
		if st == nil {
			continue
		}
		if i, ok := slices.BinarySearchFunc(st.all, e.p.ID, byID); ok {
			st.all = slices.Delete(st.all, i, i+1)
		}
		if len(st.all) == 0 {
			delete(s.sets, k)
		}
		if k.kind == kindAction {
			s.pruneDeparted()
			if s.departed[e.p.Pool] == nil {
				s.departed[e.p.Pool] = map[string]time.Time{}
			}
			s.departed[e.p.Pool][k.name] = s.now()
			acts := s.offered(e.p.Pool)
			if acts[k.name]--; acts[k.name] <= 0 {
				delete(acts, k.name)
			}
			if len(acts) == 0 {
				delete(s.actions, e.p.Pool)
			}
		}
	}
	for i := range e.sets {
		m := &e.sets[i]
		if m.s.view {
			if j, ok := slices.BinarySearchFunc(m.s.all, e.p.ID, byID); ok {
				m.s.all = slices.Delete(m.s.all, j, j+1)
			}
		}
		if e.eligible {
			m.s.eligible--
		}
		if e.draining {
			m.s.draining--
		}
		m.s.capacity -= e.slots
		if m.openAt >= 0 {
			removeOpen(m.s, m.openAt)
		}
	}
	e.sets = e.sets[:0]
}

// offered is the pool's count of agents per action.
func (s *Selector) offered(pool string) map[string]int {
	acts, ok := s.actions[pool]
	if !ok {
		acts = map[string]int{}
		s.actions[pool] = acts
	}
	return acts
}

// removeOpen swap-deletes st.open[i] and fixes the moved entry's index.
func removeOpen(st *set, i int) {
	last := len(st.open) - 1
	moved := st.open[last]
	st.open[i] = moved
	st.open[last] = nil
	st.open = st.open[:last]
	if i == last {
		return
	}
	for j := range moved.sets {
		if moved.sets[j].s == st {
			moved.sets[j].openAt = i
			return
		}
	}
}

// refresh recomputes e's eligibility, draining, slots and openness after
// anything it depends on changed (heartbeat, assignment, release, health)
// and moves it into or out of its sets' open lists and counts.
func (s *Selector) refresh(e *entry) {
	e.factor = s.cfg.HealthFactors.Of(e.h.Level)
	eligible := !e.p.Draining && (!e.assessed || e.factor > 0)
	open := eligible && !e.full()
	// A newer heartbeat may change max_concurrent, and eligibility adds or
	// removes all of it: move the difference into every set's capacity.
	slots := 0
	if eligible {
		slots = e.capacity()
	}
	if d := slots - e.slots; d != 0 {
		for i := range e.sets {
			e.sets[i].s.capacity += d
		}
		e.slots = slots
	}
	if eligible != e.eligible {
		d := 1
		if !eligible {
			d = -1
		}
		for i := range e.sets {
			e.sets[i].s.eligible += d
		}
		e.eligible = eligible
	}
	if e.p.Draining != e.draining {
		d := 1
		if !e.p.Draining {
			d = -1
		}
		for i := range e.sets {
			e.sets[i].s.draining += d
		}
		e.draining = e.p.Draining
	}
	if open == e.open {
		return
	}
	e.open = open
	for i := range e.sets {
		m := &e.sets[i]
		if open {
			m.openAt = len(m.s.open)
			m.s.open = append(m.s.open, e)
		} else if m.openAt >= 0 {
			removeOpen(m.s, m.openAt)
			m.openAt = -1
		}
	}
}

// Capacity is the number of tasks the eligible agents of pool offering
// action may run at once (the sum of their max_concurrent, at least 1
// each). The scheduler uses it, for every step of a multi-step job, to keep
// one large job from taking every slot of a pool: it is the action set's
// running sum, O(1) whatever the fleet's size.
func (s *Selector) Capacity(pool, action string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.sets[setKey{kind: kindAction, pool: pool, name: action}]
	if st == nil {
		return 0
	}
	return st.capacity
}

// CapacityFor is Capacity counting only the agents that have every
// capability in requires: the slots a step that requires them can use.
// The smallest set every such agent is in is walked when it is small
// (exactLimit); a larger one is answered from the query's view, made if
// need be (one walk, then kept up to date), as a decision for the step
// would make it: views are few (maxViews), and one made for small sets
// here would push out the ones decisions rely on.
func (s *Selector) CapacityFor(pool, action string, requires []string) int {
	if len(requires) == 0 {
		return s.Capacity(pool, action)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	actionSet := s.sets[setKey{kind: kindAction, pool: pool, name: action}]
	if actionSet == nil {
		return 0
	}
	src := s.narrowest(pool, actionSet, requires)
	if src == nil {
		return 0
	}
	req := Request{Pool: pool, Action: action, Requires: requires}
	v := s.viewOf(req, nil)
	if v == nil && len(src.all) <= exactLimit {
		n := 0
		for _, e := range src.all {
			if e.offers(action) && hasAll(e.p.Capabilities, requires) {
				n += e.slots // 0 for one not eligible
			}
		}
		return n
	}
	if v == nil {
		v = s.buildView(req, nil, src)
	}
	return v.capacity
}

// pruneDeparted forgets departures older than offlineMemory, at most once
// an hour: each pool and action an agent ever left stayed for good, which
// ephemeral pools (one per branch or run) grew without bound. Callers
// hold s.mu.
func (s *Selector) pruneDeparted() {
	now := s.now()
	if now.Sub(s.prunedAt) < time.Hour {
		return
	}
	s.prunedAt = now
	for pool, acts := range s.departed {
		for a, left := range acts {
			if now.Sub(left) >= offlineMemory {
				delete(acts, a)
			}
		}
		if len(acts) == 0 {
			delete(s.departed, pool)
		}
	}
}

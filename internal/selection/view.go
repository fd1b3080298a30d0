package selection

import (
	"maps"
	"slices"
)

// This file keeps query views: for a query (pool, action, required
// capabilities and, for affinity, wanted labels) whose matching agents are
// too rare for a few random draws to find, or all full, the set of exactly
// those agents, maintained like the index's sets, so that the decision
// stays exact and costs a few draws, or its counts, however rare they are.
// A step with required capabilities uses the view without labels
// (Selector.required); affinity the one with its labels.
//
// An affinity decision in a large set first draws from whichever of the
// action's (or capability's) set and the wanted labels' sets has the fewest
// open agents, testing each draw for the rest. That finds a matching agent
// at once when they are not rare in that list. When every draw misses,
// "none" could be a sampling accident, and walking the list to be sure
// costs up to the whole of it on every decision (100 µs at 5,000 agents
// when the zone's agents offering the action are all full and both lists
// are large) — a view answers instead: built once by one walk of the
// smallest of those sets, then kept up to date as agents join, leave and
// change (an agent is a member while its presence matches the query, and
// in the view's open list while it is open, like any set). Only queries
// that once missed get a view; at most maxViews are kept, the least
// recently used dropped first. The same holds for the view of a step with
// required capabilities in a large set (any strategy): without it, a
// waiting step (all matching agents full) or one whose agents are rare
// walked the set on every decision, every retry.

// maxViews bounds the views a selector keeps (and so what they add to the
// cost of a join and to the memory per agent).
const maxViews = 64

// view is the agents of a pool whose presence matches one query: action,
// required capabilities and wanted labels (none for a step's
// capabilities alone).
type view struct {
	set          // all: members sorted by id; open: those open
	pool, action string
	requires     []string
	want         map[string]string
	used         uint64 // s.tick at its last use
}

// admits reports whether e matches v's query (eligibility and load aside).
func (v *view) admits(e *entry) bool {
	return e.p.Pool == v.pool && e.offers(v.action) && hasAll(e.p.Capabilities, v.requires) &&
		hasLabels(e.p.Labels, v.want)
}

// viewOf returns the view of the query, nil when there is none.
func (s *Selector) viewOf(req Request, want map[string]string) *view {
	for _, v := range s.views[req.Pool] {
		if v.action == req.Action && slices.Equal(v.requires, req.Requires) && maps.Equal(v.want, want) {
			s.tick++
			v.used = s.tick
			return v
		}
	}
	return nil
}

// buildView makes the view of the query from one walk of base, a set every
// member of the view is in (the smallest such), dropping the least recently
// used view when there are maxViews already. It keeps copies of the query's
// slices and maps: holding the caller's would make every decision allocate
// them on the heap.
func (s *Selector) buildView(req Request, want map[string]string, base *set) *view {
	if s.nviews >= maxViews {
		var lru *view
		for _, vs := range s.views {
			for _, v := range vs {
				if lru == nil || v.used < lru.used {
					lru = v
				}
			}
		}
		s.dropView(lru)
	}
	s.tick++
	v := &view{set: set{view: true}, pool: req.Pool, action: req.Action,
		requires: slices.Clone(req.Requires), want: make(map[string]string, len(want)), used: s.tick}
	for k, val := range want {
		v.want[k] = val // not maps.Clone: its argument escapes
	}
	for _, e := range base.all {
		if v.admits(e) {
			enter(&v.set, e)
		}
	}
	if s.views == nil {
		s.views = map[string][]*view{}
	}
	s.views[req.Pool] = append(s.views[req.Pool], v)
	s.nviews++
	return v
}

// dropView takes v's members out of it and forgets it.
func (s *Selector) dropView(v *view) {
	for _, e := range v.all {
		for j := range e.sets {
			if m := e.sets[j]; m.s == &v.set {
				if m.openAt >= 0 {
					removeOpen(m.s, m.openAt)
				}
				e.sets = slices.Delete(e.sets, j, j+1)
				break
			}
		}
	}
	vs := s.views[v.pool]
	i := slices.Index(vs, v)
	vs = slices.Delete(vs, i, i+1)
	if len(vs) == 0 {
		delete(s.views, v.pool)
	} else {
		s.views[v.pool] = vs
	}
	s.nviews--
}

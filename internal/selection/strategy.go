package selection

import (
	"math/rand/v2"
	"slices"
)

// exactLimit is the size up to which a set is evaluated whole: every
// strategy then decides exactly as its definition says.
const exactLimit = 64

// sampleSize is how many open agents an untargeted decision in a larger
// set draws (with replacement) for score, least_loaded and affinity.
const sampleSize = 8

// pick applies the pool's strategy to the available agents; nil when the
// strategy finds every allowed agent full. commit moves the round-robin
// cursor.
func (s *Selector) pick(available []candidate, req Request, commit bool) *candidate {
	strategy := s.cfg.strategyOf(req.Pool)
	if req.Agent != "" {
		// One agent: nothing to choose. In a round_robin pool the step
		// still takes that agent's turn: placed on the agent a Peek named
		// (higher work waits), it left the turn where it was, and the
		// pool filled one agent at a time.
		c := best(available, byScore)
		if c != nil && commit && strategy == StrategyRoundRobin {
			s.moveTurn(turnOf(req), c.p.ID)
		}
		return c
	}
	switch strategy {
	case StrategyStandby:
		primary := &available[0]
		for i := range available {
			if available[i].p.ID < primary.p.ID {
				primary = &available[i]
			}
		}
		if primary.full() {
			return nil
		}
		return primary
	case StrategyRoundRobin:
		turn := turnOf(req)
		last := s.turns[turn].last
		var first, next *candidate // lowest id overall, lowest id after last
		for i := range available {
			c := &available[i]
			if c.full() {
				continue
			}
			if first == nil || c.p.ID < first.p.ID {
				first = c
			}
			if c.p.ID > last && (next == nil || c.p.ID < next.p.ID) {
				next = c
			}
		}
		if next == nil {
			next = first
		}
		if next != nil && commit {
			s.moveTurn(turn, next.p.ID)
		}
		return next
	case StrategyLeastLoaded:
		return best(available, func(a, b *candidate) int {
			if la, lb := a.load(), b.load(); la != lb {
				return cmpFloat(lb, la) // lower load is better
			}
			return cmpFloat(a.factor, b.factor)
		})
	case StrategyAffinity:
		if want := s.affinity(req); len(want) > 0 {
			matching := best(available, func(a, b *candidate) int {
				if ma, mb := hasLabels(a.p.Labels, want), hasLabels(b.p.Labels, want); ma != mb {
					if ma {
						return 1
					}
					return -1
				}
				return byScore(a, b)
			})
			return matching
		}
	}
	return best(available, byScore)
}

// fast decides for an untargeted request in a set larger than exactLimit
// without looking at every member; nil sends the caller to the exact
// evaluation (which then also finds the precise error); an error is final. round_robin and
// standby walk the set in id order from where they left off, so they stay
// exact; score, least_loaded and affinity take the best of sampleSize open
// agents drawn at random (the power of d choices), which at this size
// spreads load as well as the global best without its cost.
func (s *Selector) fast(src *set, req Request, commit bool) (*entry, error) {
	match := func(e *entry) bool {
		return e.offers(req.Action) && hasAll(e.p.Capabilities, req.Requires)
	}
	switch s.cfg.strategyOf(req.Pool) {
	case StrategyStandby:
		for _, e := range src.all {
			if e.eligible && match(e) {
				if e.open {
					return e, nil
				}
				return nil, errAtCapacity(req) // the primary is full: wait for it
			}
		}
		return nil, nil
	case StrategyRoundRobin:
		turn := turnOf(req)
		last := s.turns[turn].last
		start, found := slices.BinarySearchFunc(src.all, last, byID)
		if found {
			start++
		}
		for i := range len(src.all) {
			e := src.all[(start+i)%len(src.all)]
			if e.open && match(e) {
				if commit {
					s.moveTurn(turn, e.p.ID)
				}
				return e, nil
			}
		}
		return nil, nil
	case StrategyLeastLoaded:
		return s.sample(src, match, func(a, b *candidate) int {
			if la, lb := a.load(), b.load(); la != lb {
				return cmpFloat(lb, la)
			}
			return cmpFloat(a.factor, b.factor)
		}), nil
	case StrategyAffinity:
		if want := s.affinity(req); len(want) > 0 {
			if e := s.preferred(src, req, want, match); e != nil {
				return e, nil
			}
			// No open agent both matches and holds the labels: score among
			// all, as the strategy says.
		}
	}
	return s.sample(src, match, byScore), nil
}

// preferred is affinity's choice in a large set: the best by score of the
// open agents of src that match and hold every wanted label; nil when no
// open agent does (none has the labels, or all that have them are full).
//
// Such an agent is open in src and in each wanted label's set, so it is
// drawn from whichever of those has the fewest open agents and tested for
// membership in the others (its actions, capabilities and labels). Drawing
// from a label's set alone, as before, found none of them whenever the
// labels were common and the action rare (8 draws from the 500 agents of a
// zone of which 50 offer the action miss 43% of the time), and the step
// went to an agent outside the zone while matching ones had free slots.
// When every draw misses, the query's view (view.go), built on that first
// miss, answers exactly: "none matches" is never a sampling accident.
func (s *Selector) preferred(src *set, req Request, want map[string]string, match func(*entry) bool) *entry {
	if v := s.viewOf(req, want); v != nil {
		return s.fromView(v)
	}
	base, smallest := src, src // fewest open agents, fewest members
	for k, val := range want {
		l := s.sets[setKey{kind: kindLabel, pool: req.Pool, name: k, value: val}]
		if l == nil {
			return nil // no agent of the pool has this label
		}
		if len(l.open) < len(base.open) {
			base = l
		}
		if len(l.all) < len(smallest.all) {
			smallest = l
		}
	}
	ok := func(e *entry) bool { return match(e) && hasLabels(e.p.Labels, want) }
	if len(base.open) <= exactLimit {
		return s.bestOf(base.open, ok, byScore) // exact
	}
	if e := s.sample(base, ok, byScore); e != nil {
		return e
	}
	return s.fromView(s.buildView(req, want, smallest))
}

// fromView is the best by score of v's open agents, every one of which
// matches: all of them when few, else sampleSize draws.
func (s *Selector) fromView(v *view) *entry {
	all := func(*entry) bool { return true }
	switch {
	case len(v.open) == 0:
		return nil
	case len(v.open) <= exactLimit:
		return s.bestOf(v.open, all, byScore)
	}
	return s.sample(&v.set, all, byScore)
}

// sample returns the best by cmp of sampleSize open members of src drawn
// at random that match; nil when none of the draws matched.
func (s *Selector) sample(src *set, match func(*entry) bool, cmp func(a, b *candidate) int) *entry {
	for range sampleSize {
		if e := src.open[rand.IntN(len(src.open))]; match(e) {
			s.consider(e, cmp)
		}
	}
	return s.elected()
}

// bestOf returns the best by cmp of the entries in list that match.
func (s *Selector) bestOf(list []*entry, match func(*entry) bool, cmp func(a, b *candidate) int) *entry {
	for _, e := range list {
		if match(e) {
			s.consider(e, cmp)
		}
	}
	return s.elected()
}

// consider makes e the best so far (s.duel[0]) when there is none yet or
// cmp ranks it higher (among equals, the lower id wins). The candidates
// live in the selector, under s.mu: as locals handed by pointer to cmp, a
// func value, they escaped to the heap, one allocation per draw that
// matched (8 per sampled decision).
func (s *Selector) consider(e *entry, cmp func(a, b *candidate) int) {
	b, c := &s.duel[0], &s.duel[1]
	*c = s.candidate(e)
	if b.e == nil {
		*b = *c
		return
	}
	if r := cmp(c, b); r > 0 || (r == 0 && c.p.ID < b.p.ID) {
		*b = *c
	}
}

// elected returns the best entry considered and starts afresh (dropping
// the pointers into the index).
func (s *Selector) elected() *entry {
	e := s.duel[0].e
	s.duel = [2]candidate{}
	return e
}

// byScore prefers the higher score, then the lower load.
func byScore(a, b *candidate) int {
	if sa, sb := a.score(), b.score(); sa != sb {
		return cmpFloat(sa, sb)
	}
	return cmpFloat(b.load(), a.load())
}

func cmpFloat(a, b float64) int {
	switch {
	case a > b:
		return 1
	case a < b:
		return -1
	}
	return 0
}

// best returns the candidate that is not full and that cmp ranks highest
// (cmp(a, b) > 0: a is better); among equals the lowest id. nil when all
// are full.
func best(cs []candidate, cmp func(a, b *candidate) int) *candidate {
	var b *candidate
	for i := range cs {
		c := &cs[i]
		if c.full() {
			continue
		}
		if b == nil {
			b = c
			continue
		}
		if r := cmp(c, b); r > 0 || (r == 0 && c.p.ID < b.p.ID) {
			b = c
		}
	}
	return b
}

// affinity returns the labels wanted for req: the pool's, overridden by the
// request's.
func (s *Selector) affinity(req Request) map[string]string {
	want := map[string]string{}
	for k, v := range s.cfg.Pools[req.Pool].Affinity {
		want[k] = v
	}
	for k, v := range req.Labels {
		want[k] = v
	}
	return want
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

package selection

import "strings"

// This file keeps round_robin's turns: for each kind of step — its pool,
// action and required capabilities — the id of the agent that kind last
// went to, so that the next one goes to the eligible agent after it. A
// turn per pool, shared by every kind of step, let one kind move it for
// another: with agents a, b and c offering x and only b offering y, steps
// alternating x and y gave x to c every time (after y's b) and never to a
// or b.
//
// Turns are few (one per kind of step the pool's work has) and small; at
// most maxTurns are kept, the least recently moved dropped first (that
// kind then starts again from the lowest id).

// maxTurns bounds the round-robin turns a selector keeps.
const maxTurns = 1024

// turnKey names a kind of step: requires is its required capabilities
// joined by NUL, in the request's order.
type turnKey struct{ pool, action, requires string }

// turn is where a kind of step's round robin stands.
type turn struct {
	last string // id of the agent it last went to
	used uint64 // s.tick when it moved, for eviction
}

func turnOf(req Request) turnKey {
	// No allocation for the usual zero or one required capability.
	return turnKey{pool: req.Pool, action: req.Action, requires: strings.Join(req.Requires, "\x00")}
}

// moveTurn records that kind k of step went to the agent id, dropping the
// least recently moved turn when there are maxTurns already. A decision
// builds k once (turnOf) and reads its turn as s.turns[k].last ("" when
// none: the turn starts at the lowest id).
func (s *Selector) moveTurn(k turnKey, id string) {
	if _, ok := s.turns[k]; !ok && len(s.turns) >= maxTurns {
		var lru turnKey
		oldest := ^uint64(0)
		for other, t := range s.turns {
			if t.used < oldest {
				lru, oldest = other, t.used
			}
		}
		delete(s.turns, lru)
	}
	s.tick++
	s.turns[k] = turn{last: id, used: s.tick}
}

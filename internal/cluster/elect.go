package cluster

import (
	"sort"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Candidate is a member that may become leader.
type Candidate struct {
	Key string
	// Standby is true when the last state had it as a healthy standby.
	Standby bool
	// Load is in_flight / max_concurrent.
	Load float64
}

// ElectionOrder returns the candidates' keys best first, as seed 000's
// election orders them: a manual failover's handoff target first; then by
// strategy — standby: standbys before other members, then least loaded;
// least_loaded: least loaded; round_robin: the members after the previous
// leader in key order. Ties go to the smaller key, so every member computes
// the same order from the same state.
func ElectionOrder(cands []Candidate, strategy, previous, handoff string) []string {
	c := append([]Candidate(nil), cands...)
	first := func(a, b Candidate) (bool, bool) {
		if (a.Key == handoff) != (b.Key == handoff) {
			return a.Key == handoff, true
		}
		return false, false
	}
	switch strategy {
	case protocol.StrategyRoundRobin:
		sort.Slice(c, func(i, j int) bool {
			if less, ok := first(c[i], c[j]); ok {
				return less
			}
			// Keys after previous come first, in order, then the rest.
			ai, bj := c[i].Key > previous, c[j].Key > previous
			if ai != bj {
				return ai
			}
			return c[i].Key < c[j].Key
		})
	default:
		sort.Slice(c, func(i, j int) bool {
			if less, ok := first(c[i], c[j]); ok {
				return less
			}
			if strategy == protocol.StrategyStandby && c[i].Standby != c[j].Standby {
				return c[i].Standby
			}
			if c[i].Load != c[j].Load {
				return c[i].Load < c[j].Load
			}
			return c[i].Key < c[j].Key
		})
	}
	out := make([]string, len(c))
	for i := range c {
		out[i] = c[i].Key
	}
	return out
}

// Rank is self's position in ElectionOrder, or -1 if it is not a candidate.
// A member waits Rank × a stagger before campaigning, so that the best
// candidate wins when it is alive, and any candidate wins when it is not.
func Rank(order []string, self string) int {
	for i, k := range order {
		if k == self {
			return i
		}
	}
	return -1
}

// Candidates derives the election candidates from the member reports the
// last state and the member's own observations allow: healthy, admitted and
// not excluded members.
func Candidates(prev protocol.ClusterState, reports []protocol.ClusterMemberReport) []Candidate {
	var out []Candidate
	excluded := setOf(prev.Excluded)
	for _, r := range reports {
		k := r.Key()
		if !reportHealthy(r) || excluded[k] {
			continue
		}
		m, known := prev.Member(k)
		if known && (m.Role == protocol.RoleRefused || m.Role == protocol.RoleExcluded) {
			continue
		}
		out = append(out, Candidate{Key: k, Standby: known && m.Role == protocol.RoleStandby, Load: load(r)})
	}
	return out
}

func reportHealthy(r protocol.ClusterMemberReport) bool {
	return !r.Draining && r.Health != "failed"
}

func load(r protocol.ClusterMemberReport) float64 {
	if r.MaxConcurrent <= 0 {
		return 0
	}
	return float64(r.InFlight) / float64(r.MaxConcurrent)
}

func setOf(keys []string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}

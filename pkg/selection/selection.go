package selection

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// ErrNoAgent: no eligible agent is present now; the step should wait.
var ErrNoAgent = errors.New("no eligible agent")

// ErrUnknownAction: agents of the pool are present and none offers the
// action; waiting will not help, the step should fail.
var ErrUnknownAction = errors.New("unknown action")

// Request describes the step to place.
type Request struct {
	Pool     string
	Agent    string
	Action   string
	Requires []string
}

// Selector remembers this scheduler's assignments between heartbeats.
type Selector struct {
	mu       sync.Mutex
	assigned map[string]assignment
}

type assignment struct {
	heartbeat time.Time
	count     int
}

// New returns an empty selector.
func New() *Selector { return &Selector{assigned: map[string]assignment{}} }

// Observe resets the assignment count of an agent whose heartbeat is newer
// than the one the count was started from: the heartbeat's in_flight now
// includes those tasks (or they have finished).
func (s *Selector) Observe(p protocol.Presence) {
	k := protocol.PresenceKey(p.Pool, p.ID)
	s.mu.Lock()
	defer s.mu.Unlock()
	if a, ok := s.assigned[k]; ok && p.HeartbeatAt.After(a.heartbeat) {
		delete(s.assigned, k)
	}
}

// Forget drops an agent that left.
func (s *Selector) Forget(p protocol.Presence) {
	s.mu.Lock()
	delete(s.assigned, protocol.PresenceKey(p.Pool, p.ID))
	s.mu.Unlock()
}

// Choose picks an agent for req among agents and counts the assignment.
func (s *Selector) Choose(agents []protocol.Presence, req Request) (protocol.Presence, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var (
		eligible    []protocol.Presence
		inPool      int
		offered     = map[string]bool{}
		actionFound bool
	)
	for _, a := range agents {
		if a.Pool != req.Pool {
			continue
		}
		inPool++
		for _, act := range a.Actions {
			offered[act] = true
		}
		if slices.Contains(a.Actions, req.Action) {
			actionFound = true
		} else {
			continue
		}
		if req.Agent != "" && a.ID != req.Agent {
			continue
		}
		if a.Draining || !hasAll(a.Capabilities, req.Requires) {
			continue
		}
		eligible = append(eligible, a)
	}
	if len(eligible) == 0 {
		if inPool > 0 && !actionFound {
			return protocol.Presence{}, fmt.Errorf("%w %q: no agent of pool %s offers it (offered: %s)",
				ErrUnknownAction, req.Action, req.Pool, strings.Join(sortedKeys(offered), ", "))
		}
		return protocol.Presence{}, fmt.Errorf("%w: %s", ErrNoAgent, describe(req))
	}
	best, bestLoad := -1, 0.0
	for i, a := range eligible {
		l := s.load(a)
		if best < 0 || l < bestLoad || (l == bestLoad && a.ID < eligible[best].ID) {
			best, bestLoad = i, l
		}
	}
	chosen := eligible[best]
	k := protocol.PresenceKey(chosen.Pool, chosen.ID)
	a := s.assigned[k]
	if a.count == 0 {
		a.heartbeat = chosen.HeartbeatAt
	}
	a.count++
	s.assigned[k] = a
	return chosen, nil
}

// load is (reported in-flight + assigned since that report) / capacity.
func (s *Selector) load(a protocol.Presence) float64 {
	capacity := a.MaxConcurrent
	if capacity <= 0 {
		capacity = 1
	}
	n := a.InFlight + s.assigned[protocol.PresenceKey(a.Pool, a.ID)].count
	return float64(n) / float64(capacity)
}

func hasAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

func describe(r Request) string {
	var b strings.Builder
	fmt.Fprintf(&b, "pool %s, action %s", r.Pool, r.Action)
	if r.Agent != "" {
		fmt.Fprintf(&b, ", agent %s", r.Agent)
	}
	if len(r.Requires) > 0 {
		fmt.Fprintf(&b, ", capabilities [%s]", strings.Join(r.Requires, " "))
	}
	return b.String()
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

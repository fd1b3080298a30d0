package selection

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/wardenhq/warden/pkg/health"
	"github.com/wardenhq/warden/pkg/protocol"
)

// ErrNoAgent: no eligible agent is present now; the step should wait.
var ErrNoAgent = errors.New("no eligible agent")

// ErrAtCapacity is wrapped, together with ErrNoAgent, when eligible agents
// exist but every one of them has max_concurrent tasks in flight; the step
// should wait.
var ErrAtCapacity = errors.New("all agents at capacity")

// ErrUnknownAction: agents of the pool are present and none offers the
// action; waiting will not help, the step should fail.
var ErrUnknownAction = errors.New("unknown action")

// Request describes the step to place.
type Request struct {
	Pool     string
	Agent    string
	Action   string
	Requires []string
	// Labels the affinity strategy prefers, over the pool's own affinity.
	Labels map[string]string
}

// Selector chooses agents and remembers, per agent, what this process
// assigned to it and saw finish since the agent's last heartbeat. Safe for
// concurrent use.
type Selector struct {
	cfg    Config
	mu     sync.Mutex
	counts map[string]*counts
	health map[string]health.Assessment
	cursor map[string]string // round robin: pool → id chosen last
}

// counts are relative to the freshest heartbeat seen of an agent.
type counts struct {
	heartbeat     time.Time
	inFlight      int // reported by that heartbeat
	maxConcurrent int
	assigned      int // by this selector since then
	released      int // finished after that heartbeat (see Release)
}

// New returns an empty selector with DefaultConfig.
func New() *Selector {
	s, _ := NewWithConfig(DefaultConfig())
	return s
}

// NewWithConfig validates cfg and returns an empty selector using it.
func NewWithConfig(cfg Config) (*Selector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Selector{cfg: cfg, counts: map[string]*counts{}, health: map[string]health.Assessment{}, cursor: map[string]string{}}, nil
}

// Observe records an agent's heartbeat. One newer than the last seen resets
// the agent's counts: its in_flight now includes the tasks assigned before
// it (or they have finished).
func (s *Selector) Observe(p protocol.Presence) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sync(p)
}

// Forget drops an agent that left. Its health assessment is kept until
// ClearHealth: it belongs to the assessor, and the agent may come back.
func (s *Selector) Forget(p protocol.Presence) {
	s.mu.Lock()
	delete(s.counts, protocol.PresenceKey(p.Pool, p.ID))
	s.mu.Unlock()
}

// Release records that a task of the agent (key protocol.PresenceKey)
// finished at finishedAt, as the agent's own clock says (the result's
// finished_at). A task that finished after the agent's last heartbeat was
// counted in that heartbeat's in_flight or in this selector's assignments,
// so its slot is free again before the next heartbeat says so; one that
// finished before is already out of in_flight and is ignored, as is a zero
// finishedAt. Without Release an agent gets at most max_concurrent tasks per
// heartbeat interval.
func (s *Selector) Release(key string, finishedAt time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.counts[key]
	if !ok || finishedAt.IsZero() || !finishedAt.After(c.heartbeat) {
		return
	}
	c.released = min(c.released+1, c.inFlight+c.assigned)
}

// SetHealth records an agent's assessment (key protocol.PresenceKey): its
// level scales or excludes the agent, its success rate, when set, replaces
// the one read from the agent's lifetime counters.
func (s *Selector) SetHealth(key string, a health.Assessment) {
	s.mu.Lock()
	s.health[key] = a
	s.mu.Unlock()
}

// ClearHealth drops an agent's assessment; it counts as healthy again.
func (s *Selector) ClearHealth(key string) {
	s.mu.Lock()
	delete(s.health, key)
	s.mu.Unlock()
}

// sync brings an agent's counts up to p and returns them.
func (s *Selector) sync(p protocol.Presence) *counts {
	k := protocol.PresenceKey(p.Pool, p.ID)
	c, ok := s.counts[k]
	if !ok || p.HeartbeatAt.After(c.heartbeat) {
		c = &counts{heartbeat: p.HeartbeatAt, inFlight: p.InFlight, maxConcurrent: p.MaxConcurrent}
		s.counts[k] = c
	}
	return c
}

// candidate is an eligible agent with what its choice depends on.
type candidate struct {
	p      protocol.Presence
	used   int // in flight, counting this selector's assignments
	cap    int
	factor float64 // health factor, > 0
	rate   float64 // success rate
}

func (c candidate) load() float64 { return float64(c.used) / float64(c.cap) }
func (c candidate) full() bool    { return c.used >= c.cap }
func (c candidate) score() float64 {
	return Score(c.rate, c.used, c.cap, c.factor)
}

// Score is an agent's attractiveness: success_rate / (1 + in_flight /
// max_concurrent) × health factor. A max_concurrent below 1 counts as 1.
func Score(successRate float64, inFlight, maxConcurrent int, factor float64) float64 {
	return successRate / (1 + float64(inFlight)/float64(max(maxConcurrent, 1))) * factor
}

// Choose picks an agent for req among agents and counts the assignment.
// Eligible: in req.Pool (and req.Agent when pinned), offering the action,
// with every required capability, not draining, with a health level whose
// factor is not 0, and with fewer than max_concurrent tasks in flight
// counting this selector's assignments. The pool's strategy chooses among
// them; ties go to the lowest id.
func (s *Selector) Choose(agents []protocol.Presence, req Request) (protocol.Presence, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var (
		available   []candidate
		inPool      int
		offered     = map[string]bool{}
		actionFound bool
		excluded    = map[string]int{} // why agents offering the action are not available
	)
	for _, a := range agents {
		if a.Pool != req.Pool {
			continue
		}
		inPool++
		for _, act := range a.Actions {
			offered[act] = true
		}
		if !slices.Contains(a.Actions, req.Action) {
			continue
		}
		actionFound = true
		if req.Agent != "" && a.ID != req.Agent {
			continue
		}
		key := protocol.PresenceKey(a.Pool, a.ID)
		h, assessed := s.health[key]
		factor := s.cfg.HealthFactors.Of(h.Level)
		switch {
		case a.Draining:
			excluded["draining"]++
			continue
		case !hasAll(a.Capabilities, req.Requires):
			excluded["missing capabilities"]++
			continue
		case assessed && factor <= 0:
			excluded[h.Level.String()]++
			continue
		}
		c := s.sync(a)
		available = append(available, candidate{
			p:      a,
			used:   max(0, c.inFlight+c.assigned-c.released),
			cap:    max(c.maxConcurrent, 1),
			factor: factor,
			rate:   s.successRate(a, h, assessed),
		})
	}
	if len(available) == 0 {
		if inPool > 0 && !actionFound {
			return protocol.Presence{}, fmt.Errorf("%w %q: no agent of pool %s offers it (offered: %s)",
				ErrUnknownAction, req.Action, req.Pool, strings.Join(sortedKeys(offered), ", "))
		}
		return protocol.Presence{}, fmt.Errorf("%w: %s%s", ErrNoAgent, describe(req), summarise(excluded))
	}
	sort.Slice(available, func(i, j int) bool { return available[i].p.ID < available[j].p.ID })
	chosen, ok := s.pick(available, req)
	if !ok {
		return protocol.Presence{}, fmt.Errorf("%w: %w: %s", ErrNoAgent, ErrAtCapacity, describe(req))
	}
	s.counts[protocol.PresenceKey(chosen.Pool, chosen.ID)].assigned++
	return chosen, nil
}

// pick applies the pool's strategy to the available agents (sorted by id);
// false when the strategy finds every allowed agent full.
func (s *Selector) pick(available []candidate, req Request) (protocol.Presence, bool) {
	free := make([]candidate, 0, len(available))
	for _, c := range available {
		if !c.full() {
			free = append(free, c)
		}
	}
	strategy := s.cfg.strategyOf(req.Pool)
	if req.Agent != "" {
		strategy = StrategyScore // one agent: nothing to choose
	}
	switch strategy {
	case StrategyStandby:
		if primary := available[0]; !primary.full() {
			return primary.p, true
		}
		return protocol.Presence{}, false
	case StrategyRoundRobin:
		if len(free) == 0 {
			return protocol.Presence{}, false
		}
		last := s.cursor[req.Pool]
		next := free[0]
		for _, c := range free {
			if c.p.ID > last {
				next = c
				break
			}
		}
		s.cursor[req.Pool] = next.p.ID
		return next.p, true
	case StrategyLeastLoaded:
		return best(free, func(a, b candidate) bool {
			if a.load() != b.load() {
				return a.load() < b.load()
			}
			return a.factor > b.factor
		})
	case StrategyAffinity:
		if want := s.affinity(req); len(want) > 0 {
			var matching []candidate
			for _, c := range free {
				if hasLabels(c.p.Labels, want) {
					matching = append(matching, c)
				}
			}
			if len(matching) > 0 {
				return best(matching, byScore)
			}
		}
	}
	return best(free, byScore)
}

// byScore prefers the higher score, then the lower load.
func byScore(a, b candidate) bool {
	if sa, sb := a.score(), b.score(); sa != sb {
		return sa > sb
	}
	return a.load() < b.load()
}

// best returns the candidate no other is better than; candidates are sorted
// by id, so among equals the lowest id wins.
func best(cs []candidate, better func(a, b candidate) bool) (protocol.Presence, bool) {
	if len(cs) == 0 {
		return protocol.Presence{}, false
	}
	b := cs[0]
	for _, c := range cs[1:] {
		if better(c, b) {
			b = c
		}
	}
	return b.p, true
}

// successRate is the assessment's windowed rate when it has one, otherwise
// the smoothed lifetime rate from the heartbeat's counters.
func (s *Selector) successRate(p protocol.Presence, h health.Assessment, assessed bool) float64 {
	if assessed && h.SuccessRate != nil {
		return *h.SuccessRate
	}
	n := float64(p.Succeeded) + float64(p.Failed) + s.cfg.PriorWeight
	if n == 0 {
		return s.cfg.PriorSuccessRate
	}
	return (float64(p.Succeeded) + s.cfg.PriorSuccessRate*s.cfg.PriorWeight) / n
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

// summarise says why agents offering the action were not eligible, e.g.
// " (excluded: 1 draining, 2 critical)".
func summarise(excluded map[string]int) string {
	if len(excluded) == 0 {
		return ""
	}
	parts := make([]string, 0, len(excluded))
	for _, why := range sortedKeys(excluded) {
		parts = append(parts, fmt.Sprintf("%d %s", excluded[why], why))
	}
	return " (excluded: " + strings.Join(parts, ", ") + ")"
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

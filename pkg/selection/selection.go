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
	counts map[agentKey]*counts
	health map[agentKey]health.Assessment
	cursor map[string]string // round robin: pool → id chosen last
	buf    []candidate       // reused by Choose
}

// agentKey is an agent's presence key as a struct: map lookups on it do not
// build a string per agent on every Choose.
type agentKey struct{ pool, id string }

// parseKey splits a presence key <pool>.<agent> at its last dot (agent ids
// have none).
func parseKey(key string) agentKey {
	i := strings.LastIndexByte(key, '.')
	if i < 0 {
		return agentKey{id: key}
	}
	return agentKey{pool: key[:i], id: key[i+1:]}
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
	return &Selector{cfg: cfg, counts: map[agentKey]*counts{}, health: map[agentKey]health.Assessment{},
		cursor: map[string]string{}}, nil
}

// Observe records an agent's heartbeat. One newer than the last seen resets
// the agent's counts: its in_flight now includes the tasks assigned before
// it (or they have finished).
func (s *Selector) Observe(p protocol.Presence) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sync(&p)
}

// Forget drops an agent that left. Its health assessment is kept until
// ClearHealth: it belongs to the assessor, and the agent may come back.
func (s *Selector) Forget(p protocol.Presence) {
	s.mu.Lock()
	delete(s.counts, agentKey{p.Pool, p.ID})
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
	c, ok := s.counts[parseKey(key)]
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
	s.health[parseKey(key)] = a
	s.mu.Unlock()
}

// ClearHealth drops an agent's assessment; it counts as healthy again.
func (s *Selector) ClearHealth(key string) {
	s.mu.Lock()
	delete(s.health, parseKey(key))
	s.mu.Unlock()
}

// sync brings an agent's counts up to p and returns them.
func (s *Selector) sync(p *protocol.Presence) *counts {
	k := agentKey{p.Pool, p.ID}
	c, ok := s.counts[k]
	if !ok {
		c = &counts{}
		s.counts[k] = c
	}
	if !ok || p.HeartbeatAt.After(c.heartbeat) {
		*c = counts{heartbeat: p.HeartbeatAt, inFlight: p.InFlight, maxConcurrent: p.MaxConcurrent}
	}
	return c
}

// candidate is an eligible agent with what its choice depends on.
type candidate struct {
	p      *protocol.Presence // into Choose's agents
	c      *counts
	used   int // in flight, counting this selector's assignments
	cap    int
	factor float64 // health factor, > 0
	rate   float64 // success rate
}

func (c *candidate) load() float64 { return float64(c.used) / float64(c.cap) }
func (c *candidate) full() bool    { return c.used >= c.cap }
func (c *candidate) score() float64 {
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
		inPool      int
		actionFound bool
		excluded    map[string]int // why agents offering the action are not available
	)
	exclude := func(why string) {
		if excluded == nil {
			excluded = map[string]int{}
		}
		excluded[why]++
	}
	available := s.buf[:0]
	for i := range agents {
		a := &agents[i]
		if a.Pool != req.Pool {
			continue
		}
		inPool++
		if !slices.Contains(a.Actions, req.Action) {
			continue
		}
		actionFound = true
		if req.Agent != "" && a.ID != req.Agent {
			continue
		}
		var h health.Assessment
		var assessed bool
		if len(s.health) > 0 {
			h, assessed = s.health[agentKey{a.Pool, a.ID}]
		}
		factor := s.cfg.HealthFactors.Of(h.Level)
		switch {
		case a.Draining:
			exclude("draining")
			continue
		case !hasAll(a.Capabilities, req.Requires):
			exclude("missing capabilities")
			continue
		case assessed && factor <= 0:
			exclude(h.Level.String())
			continue
		}
		c := s.sync(a)
		available = append(available, candidate{
			p:      a,
			c:      c,
			used:   max(0, c.inFlight+c.assigned-c.released),
			cap:    max(c.maxConcurrent, 1),
			factor: factor,
			rate:   s.successRate(a, h, assessed),
		})
	}
	s.buf = available[:0]
	defer clear(available) // drop the pointers into agents
	if len(available) == 0 {
		if inPool > 0 && !actionFound {
			return protocol.Presence{}, fmt.Errorf("%w %q: no agent of pool %s offers it (offered: %s)",
				ErrUnknownAction, req.Action, req.Pool, strings.Join(offered(agents, req.Pool), ", "))
		}
		return protocol.Presence{}, fmt.Errorf("%w: %s%s", ErrNoAgent, describe(req), summarise(excluded))
	}
	chosen := s.pick(available, req)
	if chosen == nil {
		return protocol.Presence{}, fmt.Errorf("%w: %w: %s", ErrNoAgent, ErrAtCapacity, describe(req))
	}
	chosen.c.assigned++
	return *chosen.p, nil
}

// offered lists the actions the pool's agents offer, sorted.
func offered(agents []protocol.Presence, pool string) []string {
	set := map[string]bool{}
	for _, a := range agents {
		if a.Pool == pool {
			for _, act := range a.Actions {
				set[act] = true
			}
		}
	}
	return sortedKeys(set)
}

// successRate is the assessment's windowed rate when it has one, otherwise
// the smoothed lifetime rate from the heartbeat's counters.
func (s *Selector) successRate(p *protocol.Presence, h health.Assessment, assessed bool) float64 {
	if assessed && h.SuccessRate != nil {
		return *h.SuccessRate
	}
	n := float64(p.Succeeded) + float64(p.Failed) + s.cfg.PriorWeight
	if n == 0 {
		return s.cfg.PriorSuccessRate
	}
	return (float64(p.Succeeded) + s.cfg.PriorSuccessRate*s.cfg.PriorWeight) / n
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

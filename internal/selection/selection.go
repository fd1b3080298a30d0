package selection

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/pkg/protocol"
)

// ErrNoAgent: no eligible agent is present now; the step should wait.
var ErrNoAgent = errors.New("no eligible agent")

// ErrAtCapacity is wrapped, together with ErrNoAgent, when eligible agents
// exist but every one of them has max_concurrent tasks in flight; the step
// should wait.
var ErrAtCapacity = errors.New("all agents at capacity")

// ErrUnknownAction: agents of the pool are present and none offers the
// action, nor did any that left in the last 24 hours (offlineMemory);
// waiting will not help, the step should fail.
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

// Selector chooses agents. It keeps its own index of the present agents,
// fed by Observe and Forget (presence.View.Feed does that from the presence
// watch, initial state included), and remembers, per agent, what this
// process assigned to it and saw finish since the agent's last heartbeat.
// A decision looks agents up in that index: a pinned step costs one map
// lookup, an untargeted one a bounded sample; nothing copies or scans the
// fleet. Safe for concurrent use.
type Selector struct {
	cfg     Config
	mu      sync.Mutex
	entries map[agentKey]*entry
	sets    map[setKey]*set
	actions map[string]map[string]int // pool → action → agents offering it
	// departed remembers, per pool, when an agent offering an action last
	// left (or stopped offering it), for offlineMemory: a step for it
	// waits for the agent instead of failing as an unknown action.
	departed map[string]map[string]time.Time
	prunedAt time.Time // departed's last pruning (pruneDeparted)
	// started is when the selector began; for Config.StartGrace after
	// it, an action no agent offers waits (see decide).
	started time.Time
	now     func() time.Time
	health  map[agentKey]health.Assessment
	turns   map[turnKey]turn   // round robin, per kind of step (turn.go)
	buf     []candidate        // reused by the exact evaluation
	duel    [2]candidate       // best so far and contender (consider)
	views   map[string][]*view // query views by pool (view.go)
	nviews  int
	tick    uint64 // orders the views' uses and the turns' moves, for eviction
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
	return &Selector{cfg: cfg, entries: map[agentKey]*entry{}, sets: map[setKey]*set{},
		actions: map[string]map[string]int{}, departed: map[string]map[string]time.Time{}, now: time.Now, started: time.Now(),
		health: map[agentKey]health.Assessment{},
		turns:  map[turnKey]turn{}}, nil
}

// Observe records an agent's presence. One older than the last seen is
// ignored. One newer resets the agent's counts: its in_flight now includes
// the tasks assigned before it (or they have finished).
func (s *Selector) Observe(p protocol.Presence) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := agentKey{p.Pool, p.ID}
	e, ok := s.entries[k]
	if !ok {
		e = &entry{key: k, p: p, c: counts{heartbeat: p.HeartbeatAt, inFlight: p.InFlight, maxConcurrent: p.MaxConcurrent}}
		e.h, e.assessed = s.health[k]
		s.refresh(e)
		s.entries[k] = e
		s.join(e)
		return
	}
	if p.HeartbeatAt.Before(e.p.HeartbeatAt) {
		return
	}
	if !sameSets(&e.p, &p) {
		s.leave(e)
		e.p = p
		s.join(e)
	} else {
		e.p = p
	}
	if p.HeartbeatAt.After(e.c.heartbeat) {
		e.c = counts{heartbeat: p.HeartbeatAt, inFlight: p.InFlight, maxConcurrent: p.MaxConcurrent}
	}
	s.refresh(e)
}

// Forget drops an agent that left. Its health assessment is kept until
// ClearHealth: it belongs to the assessor, and the agent may come back.
func (s *Selector) Forget(p protocol.Presence) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := agentKey{p.Pool, p.ID}
	if e, ok := s.entries[k]; ok {
		s.leave(e)
		delete(s.entries, k)
	}
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
	e, ok := s.entries[parseKey(key)]
	if !ok || finishedAt.IsZero() || !finishedAt.After(e.c.heartbeat) {
		return
	}
	e.c.released = min(e.c.released+1, e.c.inFlight+e.c.assigned)
	s.refresh(e)
}

// SetHealth records an agent's assessment (key protocol.PresenceKey): its
// level scales or excludes the agent, its success rate, when set, replaces
// the one read from the agent's lifetime counters.
func (s *Selector) SetHealth(key string, a health.Assessment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := parseKey(key)
	s.health[k] = a
	if e, ok := s.entries[k]; ok {
		e.h, e.assessed = a, true
		s.refresh(e)
	}
}

// ClearHealth drops an agent's assessment; it counts as healthy again.
func (s *Selector) ClearHealth(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := parseKey(key)
	delete(s.health, k)
	if e, ok := s.entries[k]; ok {
		e.h, e.assessed = health.Assessment{}, false
		s.refresh(e)
	}
}

// candidate is an eligible agent with what its choice depends on.
type candidate struct {
	e      *entry
	p      *protocol.Presence // &e.p
	used   int                // in flight, counting this selector's assignments
	cap    int
	factor float64 // health factor, > 0
	rate   float64 // success rate
}

func (s *Selector) candidate(e *entry) candidate {
	return candidate{e: e, p: &e.p, used: e.used(), cap: e.capacity(), factor: e.factor, rate: s.successRate(e)}
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

// Choose picks an agent for req among the observed agents and counts the
// assignment. Eligible: in req.Pool (and req.Agent when pinned), offering
// the action, with every required capability, not draining, with a health
// level whose factor is not 0, and with fewer than max_concurrent tasks in
// flight counting this selector's assignments. The pool's strategy chooses
// among them (see pick and the package doc for how large pools are
// sampled).
func (s *Selector) Choose(req Request) (protocol.Presence, error) {
	return s.choose(req, true)
}

// Peek decides as Choose does without counting the assignment or moving a
// round-robin cursor: what Choose would return now. Benchmarks time
// decisions on a live view with it without filling the agents' capacity.
func (s *Selector) Peek(req Request) (protocol.Presence, error) {
	return s.choose(req, false)
}

// PeekScore is the score the score strategy would give the agent Peek
// would return now: its success rate, its load counting this selector's own
// assignments since its last heartbeat, and its health factor. Routing
// among a fixed set of agents (an active-active cluster's members) uses
// it; their last heartbeats alone would send a whole burst to the one that
// last reported itself idle.
func (s *Selector) PeekScore(req Request) (float64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.decide(req, false)
	if err != nil {
		return 0, err
	}
	c := s.candidate(e)
	return c.score(), nil
}

func (s *Selector) choose(req Request, commit bool) (protocol.Presence, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.decide(req, commit)
	if err != nil {
		return protocol.Presence{}, err
	}
	if commit {
		e.c.assigned++
		s.refresh(e)
	}
	return e.p, nil
}

// narrowest is the smallest of actionSet and the sets of pool's agents
// with each capability in requires: every agent that can take the step is
// in it. nil when no agent of the pool has one of them. Callers hold s.mu.
func (s *Selector) narrowest(pool string, actionSet *set, requires []string) *set {
	src := actionSet
	for _, c := range requires {
		cs := s.sets[setKey{kind: kindCapability, pool: pool, name: c}]
		if cs == nil {
			return nil
		}
		if len(cs.all) < len(src.all) {
			src = cs
		}
	}
	return src
}

// decide finds the entry for req. Callers hold s.mu.
func (s *Selector) decide(req Request, commit bool) (*entry, error) {
	actionSet := s.sets[setKey{kind: kindAction, pool: req.Pool, name: req.Action}]
	if actionSet == nil {
		if left, ok := s.departed[req.Pool][req.Action]; ok && s.now().Sub(left) < offlineMemory {
			return nil, fmt.Errorf("%w: %s (offered only by agents now offline, the last gone %s ago)",
				ErrNoAgent, describe(req), s.now().Sub(left).Round(time.Second))
		}
		if since, grace := s.now().Sub(s.started), s.cfg.StartGrace.Std(); since < grace {
			// It knows of departures only from its start: an agent
			// offline across a scheduler's restart (or one restarting
			// with it) was not seen leave, and its steps failed for good.
			return nil, fmt.Errorf("%w: %s (no agent of the pool offers it; this scheduler started %s ago and waits %s for agents to come back before it calls the action unknown)",
				ErrNoAgent, describe(req), since.Round(time.Second), grace)
		}
		if _, inPool := s.sets[setKey{kind: kindPool, pool: req.Pool}]; inPool {
			return nil, fmt.Errorf("%w %q: no agent of pool %s offers it (offered: %s)",
				ErrUnknownAction, req.Action, req.Pool, strings.Join(sortedKeys(s.actions[req.Pool]), ", "))
		}
		return nil, fmt.Errorf("%w: %s", ErrNoAgent, describe(req))
	}
	if req.Agent != "" {
		e := s.entries[agentKey{req.Pool, req.Agent}]
		if e == nil || !e.offers(req.Action) {
			return nil, fmt.Errorf("%w: %s", ErrNoAgent, describe(req))
		}
		return s.exact([]*entry{e}, req, commit)
	}
	// Draw from the smallest set every candidate must be in.
	src := s.narrowest(req.Pool, actionSet, req.Requires)
	if src == nil {
		return nil, s.noneEligible(req, actionSet, nil) // no agent of the pool has one of them
	}
	if len(req.Requires) > 0 && len(src.all) > exactLimit {
		return s.required(req, actionSet, src, commit)
	}
	if len(src.open) == 0 && len(req.Requires) == 0 && actionSet.eligible > 0 {
		// Every eligible agent is full: the answer needs no look at them.
		return nil, errAtCapacity(req)
	}
	if len(src.open) == 0 || len(src.all) <= exactLimit {
		return s.exact(src.all, req, commit)
	}
	if e, err := s.fast(src, req, commit); e != nil || err != nil {
		return e, err
	}
	return s.exact(src.all, req, commit)
}

// required decides an untargeted step with required capabilities whose
// smallest set (src) is too large to evaluate whole. The agents that can
// take it are those of the action's set with every capability, which no
// set holds: draws from src may all miss them (rare among src's open
// agents, or all full), and a walk of src to be sure cost the whole set
// on every decision, every retry of a waiting step. The query's view
// (view.go) holds exactly them, with their counts: built on the first
// decision src does not answer (the draws, or round_robin's walk, found
// no open matching agent, or nothing of src is open), it answers every
// later decision — ErrAtCapacity and ErrNoAgent from its counts, a choice
// from its open agents, every one of which matches (round_robin and
// standby walk it in id order as they walk src: the same choice). Callers
// hold s.mu.
func (s *Selector) required(req Request, actionSet, src *set, commit bool) (*entry, error) {
	v := s.viewOf(req, nil)
	if v == nil {
		if len(src.open) > 0 {
			if e, err := s.fast(src, req, commit); e != nil || err != nil {
				return e, err
			}
		}
		v = s.buildView(req, nil, src)
	}
	switch {
	case v.eligible == 0:
		return nil, s.noneEligible(req, actionSet, v)
	case len(v.open) == 0:
		return nil, errAtCapacity(req) // every eligible one is full
	case len(v.all) <= exactLimit:
		return s.exact(v.all, req, commit)
	}
	if e, err := s.fast(&v.set, req, commit); e != nil || err != nil {
		return e, err
	}
	return s.exact(v.all, req, commit) // not reached: every open member matches
}

// noneEligible is the error for a step none of whose matching agents is
// eligible, saying why the agents offering the action are excluded as
// the exact evaluation of actionSet would (a draining agent as draining,
// one lacking a capability as missing capabilities, else its health
// level): from the sets' counts, walking only v's members (the agents
// offering the action with every capability, nil when some capability is
// no agent's), none of which is eligible, for their health levels.
// Callers hold s.mu.
func (s *Selector) noneEligible(req Request, actionSet *set, v *view) error {
	excluded := map[string]int{}
	if actionSet.draining > 0 {
		excluded["draining"] = actionSet.draining
	}
	matching, matchingDraining := 0, 0
	if v != nil {
		matching, matchingDraining = len(v.all), v.draining
		if matching > matchingDraining {
			for _, e := range v.all {
				if !e.p.Draining && e.assessed && e.factor <= 0 {
					excluded[e.h.Level.String()]++
				}
			}
		}
	}
	if n := (len(actionSet.all) - actionSet.draining) - (matching - matchingDraining); n > 0 {
		excluded["missing capabilities"] = n
	}
	return fmt.Errorf("%w: %s%s", ErrNoAgent, describe(req), summarise(excluded))
}

// exact evaluates every entry of list: the whole strategy, exactly, and
// the precise reason when none is available. Callers hold s.mu.
func (s *Selector) exact(list []*entry, req Request, commit bool) (*entry, error) {
	var excluded map[string]int // why agents offering the action are not available
	exclude := func(why string) {
		if excluded == nil {
			excluded = map[string]int{}
		}
		excluded[why]++
	}
	available := s.buf[:0]
	for _, e := range list {
		if e.p.Pool != req.Pool || !e.offers(req.Action) {
			continue
		}
		if req.Agent != "" && e.p.ID != req.Agent {
			continue
		}
		switch {
		case e.p.Draining:
			exclude("draining")
			continue
		case !hasAll(e.p.Capabilities, req.Requires):
			exclude("missing capabilities")
			continue
		case e.assessed && e.factor <= 0:
			exclude(e.h.Level.String())
			continue
		}
		available = append(available, s.candidate(e))
	}
	s.buf = available[:0]
	defer clear(available) // drop the pointers into the index
	if len(available) == 0 {
		return nil, fmt.Errorf("%w: %s%s", ErrNoAgent, describe(req), summarise(excluded))
	}
	chosen := s.pick(available, req, commit)
	if chosen == nil {
		return nil, errAtCapacity(req)
	}
	return chosen.e, nil
}

// successRate is the assessment's windowed rate when it has one, otherwise
// the smoothed lifetime rate from the heartbeat's counters.
func (s *Selector) successRate(e *entry) float64 {
	if e.assessed && e.h.SuccessRate != nil {
		return *e.h.SuccessRate
	}
	n := float64(e.p.Succeeded) + float64(e.p.Failed) + s.cfg.PriorWeight
	if n == 0 {
		return s.cfg.PriorSuccessRate
	}
	return (float64(e.p.Succeeded) + s.cfg.PriorSuccessRate*s.cfg.PriorWeight) / n
}

func errAtCapacity(req Request) error {
	return fmt.Errorf("%w: %w: %s", ErrNoAgent, ErrAtCapacity, describe(req))
}

// Matches reports whether an agent with presence p is one req may be
// placed on by what the agent is (its pool, its id when req is pinned, the
// action, every required capability), not by its load, draining or health.
func (r Request) Matches(p *protocol.Presence) bool {
	return p.Pool == r.Pool && (r.Agent == "" || p.ID == r.Agent) && slices.Contains(p.Actions, r.Action) &&
		hasAll(p.Capabilities, r.Requires)
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

// MeasureDecisions makes n decisions on s, cycling through reqs, each as a
// dispatch makes it (Choose) followed by the Release its result brings, and
// returns the mean time per decision and how many found no agent. Benches
// time selection on a live view with it.
func MeasureDecisions(s *Selector, reqs []Request, n int) (mean time.Duration, errs int) {
	if n <= 0 || len(reqs) == 0 {
		return 0, 0
	}
	start := time.Now()
	for i := range n {
		p, err := s.Choose(reqs[i%len(reqs)])
		if err != nil {
			errs++
			continue
		}
		s.Release(protocol.PresenceKey(p.Pool, p.ID), time.Now())
	}
	return time.Since(start) / time.Duration(n), errs
}

package selection_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/internal/selection"
	"github.com/wardenhq/warden/pkg/protocol"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func agent(id string, inFlight, maxConcurrent int) protocol.Presence {
	return protocol.Presence{ID: id, Pool: "p", Actions: []string{"echo"}, InFlight: inFlight,
		MaxConcurrent: maxConcurrent, HeartbeatAt: t0}
}

func key(p protocol.Presence) string { return protocol.PresenceKey(p.Pool, p.ID) }

var echo = selection.Request{Pool: "p", Action: "echo"}

func newSelector(t *testing.T, edit func(*selection.Config)) *selection.Selector {
	t.Helper()
	cfg := selection.DefaultConfig()
	cfg.StartGrace = -1 // an unknown action is unknown at once (TestStartGrace)
	if edit != nil {
		edit(&cfg)
	}
	s, err := selection.NewWithConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// chooseIn shows the selector agents (as the presence view feeds it: a
// presence not newer than the one it holds changes only eligibility, not
// counts), then chooses.
func chooseIn(s *selection.Selector, agents []protocol.Presence, req selection.Request) (protocol.Presence, error) {
	for _, a := range agents {
		s.Observe(a)
	}
	return s.Choose(req)
}

func choose(t *testing.T, s *selection.Selector, agents []protocol.Presence, req selection.Request) string {
	t.Helper()
	p, err := chooseIn(s, agents, req)
	if err != nil {
		t.Fatalf("Choose: %v", err)
	}
	return p.ID
}

// TestSeedExample: A 0.95 success with 2 of 5 in flight scores 0.68, B 0.85
// with 0 of 5 scores 0.85, C 0.90 with 5 of 5 scores 0.45 (and is full):
// B is chosen.
func TestSeedExample(t *testing.T) {
	t.Parallel()
	for _, n := range []struct {
		name  string
		setup func(s *selection.Selector, agents []protocol.Presence)
	}{
		{"windowed rates from health", func(s *selection.Selector, agents []protocol.Presence) {
			for i, rate := range []float64{0.95, 0.85, 0.90} {
				s.SetHealth(key(agents[i]), health.Assessment{Level: health.Healthy, SuccessRate: health.Known(rate)})
			}
		}},
		{"lifetime counters", func(_ *selection.Selector, agents []protocol.Presence) {
			agents[0].Succeeded, agents[0].Failed = 95, 5
			agents[1].Succeeded, agents[1].Failed = 85, 15
			agents[2].Succeeded, agents[2].Failed = 90, 10
		}},
	} {
		t.Run(n.name, func(t *testing.T) {
			t.Parallel()
			s := newSelector(t, func(c *selection.Config) { c.PriorSuccessRate, c.PriorWeight = 0.5, 0 })
			agents := []protocol.Presence{agent("A", 2, 5), agent("B", 0, 5), agent("C", 5, 5)}
			n.setup(s, agents)
			// B at 0/5: 0.85, then 1/5: 0.708 still above A's 0.679, then
			// 2/5: 0.607, below A.
			for i, want := range []string{"B", "B", "A"} {
				if got := choose(t, s, agents, echo); got != want {
					t.Fatalf("choice %d: %s, want %s", i+1, got, want)
				}
			}
		})
	}
	for _, c := range []struct {
		rate     float64
		in, max  int
		want     float64
		agentTag string
	}{{0.95, 2, 5, 0.95 / 1.4, "A"}, {0.85, 0, 5, 0.85, "B"}, {0.90, 5, 5, 0.45, "C"}} {
		if got := selection.Score(c.rate, c.in, c.max, 1); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("score of %s = %.4f, want %.4f", c.agentTag, got, c.want)
		}
	}
}

func TestEligibility(t *testing.T) {
	t.Parallel()
	base := func() []protocol.Presence {
		a := agent("a", 0, 4)
		a.Capabilities = []string{"gpu"}
		b := agent("b", 0, 4)
		c := agent("c", 0, 4)
		c.Pool = "other"
		return []protocol.Presence{a, b, c}
	}
	s := newSelector(t, nil)
	if got := choose(t, s, base(), selection.Request{Pool: "p", Action: "echo", Requires: []string{"gpu"}}); got != "a" {
		t.Errorf("capability gpu: %s, want a", got)
	}
	if got := choose(t, s, base(), selection.Request{Pool: "p", Action: "echo", Agent: "b"}); got != "b" {
		t.Errorf("pinned b: %s", got)
	}
	if got := choose(t, s, base(), selection.Request{Pool: "other", Action: "echo"}); got != "c" {
		t.Errorf("pool other: %s", got)
	}

	_, err := chooseIn(s, base(), selection.Request{Pool: "p", Action: "deploy"})
	if !errors.Is(err, selection.ErrUnknownAction) || !strings.Contains(err.Error(), "offered: echo") {
		t.Errorf("unknown action: %v", err)
	}
	_, err = chooseIn(newSelector(t, nil), nil, echo)
	if !errors.Is(err, selection.ErrNoAgent) || errors.Is(err, selection.ErrUnknownAction) {
		t.Errorf("empty pool: %v", err)
	}

	agents := base()
	agents[1].Draining = true
	_, err = chooseIn(s, agents, selection.Request{Pool: "p", Action: "echo", Requires: []string{"linux"}})
	if !errors.Is(err, selection.ErrNoAgent) || errors.Is(err, selection.ErrAtCapacity) ||
		!strings.Contains(err.Error(), "(excluded: 1 draining, 1 missing capabilities)") {
		t.Errorf("draining and capabilities: %v", err)
	}

	// Health: critical and failed get nothing, degraded and warning still work.
	hs := newSelector(t, nil)
	agents = []protocol.Presence{agent("a", 0, 4), agent("b", 0, 4), agent("c", 0, 4), agent("d", 0, 4)}
	hs.SetHealth("p.a", health.Assessment{Level: health.Failed})
	hs.SetHealth("p.b", health.Assessment{Level: health.Critical})
	hs.SetHealth("p.c", health.Assessment{Level: health.Warning})
	hs.SetHealth("p.d", health.Assessment{Level: health.Degraded})
	seen := map[string]int{}
	for range 8 {
		seen[choose(t, hs, agents, echo)]++
	}
	if seen["a"] != 0 || seen["b"] != 0 || seen["c"] != 4 || seen["d"] != 4 {
		t.Errorf("by health: %v, want c and d full, a and b none", seen)
	}
	_, err = chooseIn(hs, agents, echo)
	if !errors.Is(err, selection.ErrAtCapacity) {
		t.Errorf("after 8: %v", err)
	}
	hs.ClearHealth("p.a")
	if got := choose(t, hs, agents, echo); got != "a" {
		t.Errorf("after ClearHealth: %s, want a", got)
	}
	_, err = chooseIn(newSelector(t, nil), agents[:2], selection.Request{Pool: "p", Action: "echo"})
	if err != nil {
		t.Errorf("a fresh selector has no health: %v", err)
	}
	hs2 := newSelector(t, nil)
	hs2.SetHealth("p.a", health.Assessment{Level: health.Failed})
	hs2.SetHealth("p.b", health.Assessment{Level: health.Critical})
	_, err = chooseIn(hs2, agents[:2], echo)
	if !errors.Is(err, selection.ErrNoAgent) || !strings.Contains(err.Error(), "(excluded: 1 critical, 1 failed)") {
		t.Errorf("all unhealthy: %v", err)
	}
}

// TestDegradedScoresLower: equal agents, one degraded (×0.5): the healthy
// one takes work until 1/(1 + n/4) falls below 0.5, i.e. never before it
// is full.
func TestDegradedScoresLower(t *testing.T) {
	t.Parallel()
	s := newSelector(t, nil)
	agents := []protocol.Presence{agent("a", 0, 4), agent("b", 0, 4)}
	s.SetHealth("p.a", health.Assessment{Level: health.Degraded})
	var got []string
	for range 6 {
		got = append(got, choose(t, s, agents, echo))
	}
	if strings.Join(got, "") != "bbbbaa" {
		t.Errorf("choices %v, want b four times (until full), then a", got)
	}
}

func TestCapacity(t *testing.T) {
	t.Parallel()
	s := newSelector(t, nil)
	agents := []protocol.Presence{agent("a", 1, 2), agent("b", 0, 2), agent("c", 0, 1)}
	counts := map[string]int{}
	for range 4 { // free slots: a 1, b 2, c 1
		counts[choose(t, s, agents, echo)]++
	}
	if counts["a"] != 1 || counts["b"] != 2 || counts["c"] != 1 {
		t.Fatalf("burst: %v, want every free slot used once", counts)
	}
	_, err := chooseIn(s, agents, echo)
	if !errors.Is(err, selection.ErrNoAgent) || !errors.Is(err, selection.ErrAtCapacity) {
		t.Fatalf("all full: %v", err)
	}
	if !strings.Contains(err.Error(), "all agents at capacity: pool p, action echo") {
		t.Errorf("message: %v", err)
	}

	// A result that finished before the heartbeat the counts start from is
	// already out of in_flight: ignored. One after it frees a slot.
	s.Release("p.b", t0.Add(-time.Millisecond))
	s.Release("p.b", time.Time{})
	if _, err := chooseIn(s, agents, echo); !errors.Is(err, selection.ErrAtCapacity) {
		t.Fatalf("stale release freed a slot: %v", err)
	}
	s.Release("p.b", t0.Add(time.Millisecond))
	if got := choose(t, s, agents, echo); got != "b" {
		t.Fatalf("after release of b: %s", got)
	}
	// Releases never free more than was counted.
	for range 5 {
		s.Release("p.c", t0.Add(time.Second))
	}
	if got := choose(t, s, agents, echo); got != "c" {
		t.Fatalf("after release of c: %s", got)
	}
	if _, err := chooseIn(s, agents, echo); !errors.Is(err, selection.ErrAtCapacity) {
		t.Fatalf("extra releases freed more than one slot of c: %v", err)
	}

	// A newer heartbeat replaces the counts; an older one does not.
	hb := agent("a", 0, 2)
	hb.HeartbeatAt = t0.Add(time.Second)
	s.Observe(hb)
	old := agent("a", 0, 2)
	old.HeartbeatAt = t0.Add(-time.Second)
	s.Observe(old)
	if got := choose(t, s, agents, echo); got != "a" { // the stale list still says 1 of 2
		t.Fatalf("after a's new heartbeat: %s", got)
	}
	if got := choose(t, s, agents, echo); got != "a" {
		t.Fatalf("a has 2 free slots after its heartbeat: %s", got)
	}
	if _, err := chooseIn(s, agents, echo); !errors.Is(err, selection.ErrAtCapacity) {
		t.Fatalf("a over capacity: %v", err)
	}
	// A forgotten agent starts again from its heartbeat.
	s.Forget(agents[2])
	if got := choose(t, s, agents, echo); got != "c" {
		t.Fatalf("after Forget: %s", got)
	}
}

func TestStrategies(t *testing.T) {
	t.Parallel()
	cfg := func(strategy selection.Strategy, affinity map[string]string) func(*selection.Config) {
		return func(c *selection.Config) {
			c.Pools = map[string]selection.PoolConfig{"p": {Strategy: strategy, Affinity: affinity}}
		}
	}
	fleet := func() []protocol.Presence {
		a, b, c := agent("a", 2, 4), agent("b", 1, 4), agent("c", 0, 2)
		a.Succeeded = 1000
		c.Failed = 30 // c's success rate is low
		a.Labels = map[string]string{"zone": "eu"}
		c.Labels = map[string]string{"zone": "us", "disk": "ssd"}
		return []protocol.Presence{a, b, c}
	}
	run := func(t *testing.T, s *selection.Selector, agents []protocol.Presence, req selection.Request, n int) string {
		var out strings.Builder
		for range n {
			p, err := chooseIn(s, agents, req)
			if err != nil {
				out.WriteString("-")
				continue
			}
			out.WriteString(p.ID)
		}
		return out.String()
	}
	cases := []struct {
		name     string
		strategy selection.Strategy
		affinity map[string]string
		req      selection.Request
		edit     func([]protocol.Presence)
		want     string
	}{
		// Loads a 2/4, b 1/4, c 0/2: c (0/2), b (1/4), then all at 0.5:
		// ties by id, a; then b and c at 0.5, a at 0.75: b, c; then a, b at
		// 0.75: a, b; then all full.
		{name: "least loaded", strategy: selection.StrategyLeastLoaded, req: echo, want: "cbabcab--"},
		// In turn by id, skipping full agents: a and c fill up on their second turn.
		{name: "round robin", strategy: selection.StrategyRoundRobin, req: echo, want: "abcabcb--"},
		{name: "standby", strategy: selection.StrategyStandby, req: echo, want: "aa-"},
		{name: "standby fails over", strategy: selection.StrategyStandby, req: echo,
			edit: func(a []protocol.Presence) { a[0].Draining = true }, want: "bbb-"},
		// c matches zone=us until full, then score among all (below).
		{name: "affinity pool labels", strategy: selection.StrategyAffinity, affinity: map[string]string{"zone": "us"}, req: echo,
			want: "cc" + "babab" + "--"},
		{name: "affinity request labels win", strategy: selection.StrategyAffinity, affinity: map[string]string{"zone": "us"},
			req: selection.Request{Pool: "p", Action: "echo", Labels: map[string]string{"zone": "eu"}}, want: "aa" + "bbb" + "cc" + "--"},
		// Success rates (prior 1 × 10): a 1, b 1, c 10/40 = 0.25. Scores
		// a 1/1.5, b 1/1.25, c 0.25: b; a and b tie at 0.667 and 0.5 load:
		// a; b; tie again at 0.571: a (now full); b (full); c; c (full).
		{name: "affinity without labels is score", strategy: selection.StrategyAffinity, req: echo, want: "bababcc--"},
		{name: "score", strategy: selection.StrategyScore, req: echo, want: "bababcc--"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			agents := fleet()
			if c.edit != nil {
				c.edit(agents)
			}
			s := newSelector(t, cfg(c.strategy, c.affinity))
			if got := run(t, s, agents, c.req, len(c.want)); got != c.want {
				t.Fatalf("choices %q, want %q", got, c.want)
			}
		})
	}
}

// TestNewKeepsLeastLoadedForFreshAgents: with the default config, agents
// without history are chosen by load, ties by id, as before strategies.
func TestNewKeepsLeastLoadedForFreshAgents(t *testing.T) {
	t.Parallel()
	s := selection.New()
	agents := []protocol.Presence{agent("b", 0, 2), agent("a", 0, 2), agent("c", 1, 2)}
	var got strings.Builder
	for range 5 {
		got.WriteString(choose(t, s, agents, echo))
	}
	// a and b tie at 0/2 (a by id), then b; then all three at 1/2: a
	// (by id), b, c.
	if got.String() != "ababc" {
		t.Fatalf("choices %q, want ababc", got.String())
	}
}

// PeekScore scores an agent as the score strategy would now: its load
// counts this selector's assignments since the agent's heartbeat, and its
// health. An active-active cluster's members are routed by it; scored from
// their heartbeats alone, a burst all went to the member that last
// reported itself idle.
func TestPeekScoreCountsAssignmentsAndHealth(t *testing.T) {
	t.Parallel()
	s := newSelector(t, nil)
	a, b := agent("a", 0, 4), agent("b", 1, 4)
	s.Observe(a)
	s.Observe(b)
	score := func(id string) float64 {
		t.Helper()
		sc, err := s.PeekScore(selection.Request{Pool: "p", Action: "echo", Agent: id})
		if err != nil {
			t.Fatal(err)
		}
		return sc
	}
	if score("a") <= score("b") {
		t.Fatalf("idle a %.3f, busier b %.3f", score("a"), score("b"))
	}
	for range 2 {
		if _, err := s.Choose(selection.Request{Pool: "p", Action: "echo", Agent: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	if score("a") >= score("b") {
		t.Fatalf("after two assignments to a (between heartbeats): a %.3f, b %.3f; want b ahead", score("a"), score("b"))
	}
	before := score("b")
	s.SetHealth(key(b), health.Assessment{Level: health.Degraded})
	if score("b") >= before {
		t.Fatalf("degraded b scores %.3f, was %.3f", score("b"), before)
	}
}

// TestRoundRobinTurnsPerKindOfStep: round_robin takes the agents in turn
// for each kind of step (pool, action, required capabilities), whatever
// other steps of the pool come between. Agents a, b and c offer x, only b
// offers y (or: only b has gpu); steps alternate x and y, each released
// before the next: each agent gets a third of the x steps. With one turn
// per pool, y always moved it to b, so x went to c (after b) every time
// but the first: a 1, b 0, c 299.
func TestRoundRobinTurnsPerKindOfStep(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		n     int // agents; only the first offers y, or has gpu
		other func(x selection.Request) selection.Request
	}{
		{name: "another action", n: 3, other: func(x selection.Request) selection.Request {
			return selection.Request{Pool: "p", Action: "y"}
		}},
		{name: "required capability", n: 3, other: func(x selection.Request) selection.Request {
			x.Requires = []string{"gpu"}
			return x
		}},
		// Larger than the size evaluated whole: the walk from the turn.
		{name: "large pool", n: 100, other: func(x selection.Request) selection.Request {
			return selection.Request{Pool: "p", Action: "y"}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newSelector(t, func(cfg *selection.Config) {
				cfg.Pools = map[string]selection.PoolConfig{"p": {Strategy: selection.StrategyRoundRobin}}
			})
			for i := range c.n {
				a := agent(fmt.Sprintf("a%03d", i), 0, 4)
				a.Actions = []string{"x"}
				if i == c.n/2 {
					a.Actions = append(a.Actions, "y")
					a.Capabilities = []string{"gpu"}
				}
				s.Observe(a)
			}
			x := selection.Request{Pool: "p", Action: "x"}
			y := c.other(x)
			got := map[string]int{}
			const rounds = 100
			for i := range rounds * c.n {
				for _, req := range []selection.Request{x, y} {
					p, err := s.Choose(req)
					if err != nil {
						t.Fatalf("round %d, %+v: %v", i, req, err)
					}
					if req.Action == x.Action && len(req.Requires) == 0 {
						got[p.ID]++
					}
					s.Release(key(p), t0.Add(time.Millisecond))
				}
			}
			for i := range c.n {
				id := fmt.Sprintf("a%03d", i)
				if n := got[id]; n < rounds*9/10 || n > rounds*11/10 {
					t.Fatalf("x steps per agent %v: %s got %d, want about %d (each in turn)", got, id, n, rounds)
				}
			}
		})
	}
}

package selection_test

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/internal/selection"
	"github.com/wardenhq/warden/pkg/protocol"
)

// simAgent is an agent in the simulation: it runs tasks for a few ticks
// each, succeeds with probability rate, and heartbeats every tick.
type simAgent struct {
	p       protocol.Presence
	rate    float64
	running []int // ticks left per running task
	got     int   // tasks received
}

type simResult struct {
	shares   map[string]int
	waits    int // choices refused because every agent was full
	maxShare float64
}

// simulate places tasks tasks on agents, perTick arriving each tick (1s).
// Each tick: tasks finish (results are released to the selector at
// tick+0.5s), every agent heartbeats, then waiting tasks are placed until
// the selector says all are at capacity. It fails the test if any agent
// ever holds more than max_concurrent.
func simulate(t *testing.T, s *selection.Selector, agents []*simAgent, tasks, perTick int, seed uint64) simResult {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed+1))
	res := simResult{shares: map[string]int{}}
	placed, waiting := 0, 0
	now := t0
	for tick := 0; placed < tasks; tick++ {
		if tick > 100_000 {
			t.Fatal("simulation does not progress")
		}
		now = now.Add(time.Second)
		// Finish tasks, report results.
		for _, a := range agents {
			kept := a.running[:0]
			for _, left := range a.running {
				if left > 1 {
					kept = append(kept, left-1)
					continue
				}
				if r.Float64() < a.rate {
					a.p.Succeeded++
				} else {
					a.p.Failed++
				}
				s.Release(key(a.p), now.Add(-500*time.Millisecond))
			}
			a.running = kept
		}
		// Heartbeats.
		for _, a := range agents {
			a.p.InFlight, a.p.HeartbeatAt = len(a.running), now
			s.Observe(a.p)
		}
		// Arrivals and placements.
		waiting += min(perTick, tasks-placed-waiting)
		for waiting > 0 {
			p, err := s.Choose(echo)
			if errors.Is(err, selection.ErrAtCapacity) {
				res.waits++
				break
			}
			if err != nil {
				t.Fatalf("tick %d: %v", tick, err)
			}
			for _, a := range agents {
				if a.p.ID == p.ID {
					a.running = append(a.running, 1+r.IntN(4))
					a.got++
					if len(a.running) > a.p.MaxConcurrent {
						t.Fatalf("tick %d: agent %s holds %d tasks, max_concurrent %d", tick, a.p.ID, len(a.running), a.p.MaxConcurrent)
					}
				}
			}
			res.shares[p.ID]++
			waiting--
			placed++
		}
	}
	for _, n := range res.shares {
		res.maxShare = max(res.maxShare, float64(n)/float64(tasks))
	}
	return res
}

// simFleet returns five agents: a to d are healthy and ordered by both success
// rate and capacity, so the formula orders them a > b > c > d at any equal
// load; e is assessed critical (its failures are its own business).
func simFleet() []*simAgent {
	mk := func(id string, rate float64, capacity int) *simAgent {
		p := agent(id, 0, capacity)
		return &simAgent{p: p, rate: rate}
	}
	return []*simAgent{
		mk("a", 0.99, 8), mk("b", 0.95, 6), mk("c", 0.85, 4), mk("d", 0.70, 3), mk("e", 0.30, 8),
	}
}

// TestDistribution places 1,000 tasks on five agents with different
// success rates and capacities, at a moderate and at a saturating arrival
// rate: no agent ever exceeds max_concurrent (checked at every placement),
// none receives all the work, the unhealthy agent receives none, and the
// shares follow the formula's ordering.
func TestDistribution(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		perTick   int
		wantWaits bool
	}{
		{"moderate load", 4, false},
		{"saturated", 12, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := selection.New()
			agents := simFleet()
			s.SetHealth("p.e", health.Assessment{Level: health.Critical, Score: 0.4})
			res := simulate(t, s, agents, 1000, c.perTick, 42)
			t.Logf("shares %v, refused for capacity %d times", res.shares, res.waits)

			if res.shares["e"] != 0 {
				t.Errorf("critical agent e received %d tasks", res.shares["e"])
			}
			if res.maxShare >= 0.9 {
				t.Errorf("one agent received %.0f%% of the work", res.maxShare*100)
			}
			order := []string{"a", "b", "c", "d"}
			for i, id := range order {
				if res.shares[id] == 0 {
					t.Errorf("healthy agent %s received nothing", id)
				}
				if i > 0 && res.shares[id] > res.shares[order[i-1]] {
					t.Errorf("agent %s received %d, more than %s's %d: shares do not follow the score ordering",
						id, res.shares[id], order[i-1], res.shares[order[i-1]])
				}
			}
			if (res.waits > 0) != c.wantWaits {
				t.Errorf("refused for capacity %d times, want some: %v", res.waits, c.wantWaits)
			}
		})
	}
}

// TestDistributionBySuccessRate: equal capacities, success rates only; at
// moderate load the more reliable agent gets more of the work.
func TestDistributionBySuccessRate(t *testing.T) {
	t.Parallel()
	s := selection.New()
	agents := []*simAgent{
		{p: agent("hi", 0, 4), rate: 0.99},
		{p: agent("mid", 0, 4), rate: 0.8},
		{p: agent("lo", 0, 4), rate: 0.5},
	}
	res := simulate(t, s, agents, 1000, 3, 7)
	t.Logf("shares %v", res.shares)
	if !(res.shares["hi"] > res.shares["mid"] && res.shares["mid"] > res.shares["lo"] && res.shares["lo"] > 0) {
		t.Fatalf("shares %v, want hi > mid > lo > 0", res.shares)
	}
}

// TestReleaseKeepsThroughput: with results released, a one-slot agent runs
// one-tick tasks back to back; without, it would wait for heartbeats.
func TestReleaseKeepsThroughput(t *testing.T) {
	t.Parallel()
	s := selection.New()
	a := agent("a", 0, 1)
	for i := range 10 {
		if _, err := chooseIn(s, []protocol.Presence{a}, echo); err != nil {
			t.Fatalf("task %d: %v", i, err)
		}
		s.Release(key(a), t0.Add(time.Duration(i+1)*time.Millisecond))
	}
}

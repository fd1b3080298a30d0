package selection

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/pkg/protocol"
)

// TestAffinityUnderChurn: in a large affinity pool where the agents in the
// wanted zone that offer the action are few (about 1 in 30 of the zone, 1
// in 25 of those offering it: 8 draws from either mostly miss them), every
// decision, through thousands of random joins, leaves, changes of labels,
// actions and capabilities, heartbeats, health changes, chooses and
// releases, gives the step to an open agent that matches the action, the
// capabilities and the labels whenever one exists (as a scan of every
// agent finds), and otherwise to an open agent that matches the action and
// capabilities. The queries (one per required capability, of 100, that 1
// agent in 10 lacks) outnumber the views the selector keeps (maxViews), so
// views are built, kept up to date, dropped and built again throughout
// (some 450-510 built and 390-450 dropped per run), and one query's view
// must never serve another. The selector used to draw from the labels' set
// alone and, when that missed, score among all agents: wrong at the first
// decision here.
func TestAffinityUnderChurn(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 5))
	cfg := DefaultConfig()
	cfg.Pools = map[string]PoolConfig{"p": {Strategy: StrategyAffinity}}
	s, err := NewWithConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	caps := make([]string, 100)
	for i := range caps {
		caps[i] = fmt.Sprintf("c%02d", i)
	}
	present := map[string]protocol.Presence{} // by id
	randomPresence := func(id string, hb time.Time) protocol.Presence {
		us := rng.IntN(2) == 0
		p := protocol.Presence{ID: id, Pool: "p", Actions: []string{"echo"}, HeartbeatAt: hb,
			MaxConcurrent: 1 + rng.IntN(3), Draining: rng.IntN(20) == 0, Labels: map[string]string{"zone": "eu"}}
		p.InFlight = rng.IntN(p.MaxConcurrent + 1)
		if us {
			p.Labels["zone"] = "us"
		}
		if (us && rng.IntN(30) == 0) || (!us && rng.IntN(5) != 0) {
			p.Actions = append(p.Actions, "train")
		}
		if rng.IntN(2) == 0 {
			p.Labels["disk"] = "ssd"
		}
		// Each capability with p 0.9: a view of one must not serve another.
		p.Capabilities = slices.DeleteFunc(slices.Clone(caps), func(string) bool { return rng.IntN(10) == 0 })
		return p
	}
	for i := range 400 {
		p := randomPresence(fmt.Sprintf("a%03d", i), t0)
		s.Observe(p)
		present[p.ID] = p
	}
	query := func() Request {
		req := Request{Pool: "p", Action: "train", Labels: map[string]string{"zone": "us"}}
		switch r := rng.IntN(10); {
		case r == 0:
		case r < 3:
			req.Labels["disk"] = "ssd"
		default:
			req.Requires = []string{caps[rng.IntN(len(caps))]}
		}
		return req
	}
	// check decides req with decide (Choose when commit, else Peek) and
	// holds its result against a scan of every agent.
	var chosen []string
	check := func(step int, req Request, commit bool) {
		t.Helper()
		var matching, open int
		s.mu.Lock()
		for _, e := range s.entries {
			if !e.open || !e.offers(req.Action) || !hasAll(e.p.Capabilities, req.Requires) {
				continue
			}
			open++
			if hasLabels(e.p.Labels, req.Labels) {
				matching++
			}
		}
		s.mu.Unlock()
		decide := s.Peek
		if commit {
			decide = s.Choose
		}
		p, err := decide(req)
		switch {
		case open == 0:
			if !errors.Is(err, ErrAtCapacity) && !errors.Is(err, ErrNoAgent) {
				t.Fatalf("step %d, %+v: no open agent, got %s, %v", step, req, p.ID, err)
			}
			return
		case err != nil:
			t.Fatalf("step %d, %+v: %d open agents, %d matching the labels: %v", step, req, open, matching, err)
		case !slices.Contains(p.Actions, req.Action) || !hasAll(p.Capabilities, req.Requires):
			t.Fatalf("step %d, %+v: %s does not offer it: %v %v", step, req, p.ID, p.Actions, p.Capabilities)
		case matching > 0 && !hasLabels(p.Labels, req.Labels):
			t.Fatalf("step %d, %+v: %s has labels %v while %d open agents match them", step, req, p.ID, p.Labels, matching)
		}
		if commit {
			chosen = append(chosen, protocol.PresenceKey(p.Pool, p.ID))
		}
	}
	for step := range 6000 {
		id := fmt.Sprintf("a%03d", rng.IntN(400))
		old, ok := present[id]
		switch r := rng.IntN(20); {
		case r < 5: // a change, or a join
			hb := t0
			if ok {
				hb = old.HeartbeatAt.Add(time.Second)
			}
			p := randomPresence(id, hb)
			s.Observe(p)
			present[id] = p
		case r < 7: // a heartbeat: new counts, same sets
			if ok {
				old.HeartbeatAt = old.HeartbeatAt.Add(time.Second)
				old.InFlight = rng.IntN(old.MaxConcurrent + 1)
				s.Observe(old)
				present[id] = old
			}
		case r < 8:
			if ok {
				s.Forget(old)
				delete(present, id)
			}
		case r < 9:
			s.SetHealth(protocol.PresenceKey("p", id), health.Assessment{Level: health.Levels()[rng.IntN(5)]})
		case r < 10:
			s.ClearHealth(protocol.PresenceKey("p", id))
		case r < 16:
			check(step, query(), true)
		default:
			if len(chosen) > 0 {
				i := rng.IntN(len(chosen))
				k := chosen[i]
				chosen = slices.Delete(chosen, i, i+1)
				if p, ok := present[parseKey(k).id]; ok {
					s.Release(k, p.HeartbeatAt.Add(time.Millisecond))
				}
			}
		}
		check(step, query(), false)
	}
}

package selection

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/pkg/protocol"
)

// TestRequiresUnderChurn: in a large pool, steps with required
// capabilities (one or two of 100 that 1 agent in 10 lacks, one no agent
// has, or one of 100 that half the agents have but hardly any offering
// the action: the draws miss) are decided, through thousands of random joins, leaves,
// changes, heartbeats, health changes, chooses and releases, as a scan of
// every agent says: an open agent that offers the action and has every
// capability when one exists (for affinity, one in the pool's zone when
// one of those is open; for standby, the lowest-id eligible one, or
// ErrAtCapacity while it is full), ErrAtCapacity when all such eligible
// agents are full, and otherwise ErrNoAgent with the reasons the scan
// finds among the agents offering the action; every set's and view's
// count of draining members stays true. The rare queries outnumber the
// views the selector keeps, so views are built, kept up to date, dropped
// and built again throughout (some 120-350 built and 60-290 dropped per
// strategy).
func TestRequiresUnderChurn(t *testing.T) {
	t.Parallel()
	for _, strategy := range strategies {
		t.Run(string(strategy), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(5, 7))
			cfg := DefaultConfig()
			cfg.Pools = map[string]PoolConfig{"p": {Strategy: strategy, Affinity: map[string]string{"zone": "us"}}}
			s, err := NewWithConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			caps, kits := make([]string, 100), make([]string, 100)
			for i := range caps {
				caps[i], kits[i] = fmt.Sprintf("c%02d", i), fmt.Sprintf("k%02d", i)
			}
			present := map[string]protocol.Presence{}
			randomPresence := func(id string, hb time.Time) protocol.Presence {
				p := protocol.Presence{ID: id, Pool: "p", Actions: []string{"echo"}, HeartbeatAt: hb,
					MaxConcurrent: 1 + rng.IntN(3), Draining: rng.IntN(10) == 0,
					Labels: map[string]string{"zone": []string{"eu", "us"}[rng.IntN(2)]}}
				p.InFlight = rng.IntN(p.MaxConcurrent + 1)
				if rng.IntN(3) != 0 {
					p.Actions = append(p.Actions, "train")
				}
				p.Capabilities = slices.DeleteFunc(slices.Clone(caps), func(string) bool { return rng.IntN(10) == 0 })
				// ship and each kit: half the agents each, rarely both
				// (about 3), which are often all draining or unhealthy.
				ship := rng.IntN(2) == 0
				if ship {
					p.Actions = append(p.Actions, "ship")
				}
				for _, k := range kits {
					if (rng.IntN(50) == 0) == ship {
						p.Capabilities = append(p.Capabilities, k)
						if ship && rng.IntN(2) == 0 {
							p.Draining = true
						}
					}
				}
				return p
			}
			for i := range 300 {
				p := randomPresence(fmt.Sprintf("a%03d", i), t0)
				s.Observe(p)
				present[p.ID] = p
			}
			query := func() Request {
				req := Request{Pool: "p", Action: []string{"echo", "train"}[rng.IntN(2)], Requires: []string{caps[rng.IntN(len(caps))]}}
				switch rng.IntN(12) {
				case 10, 11:
					req = Request{Pool: "p", Action: "ship", Requires: []string{kits[rng.IntN(len(kits))]}}
				case 0:
					req.Requires = append(req.Requires, "none") // no agent has it
				case 1, 2:
					req.Requires = append(req.Requires, caps[rng.IntN(len(caps))])
				}
				return req
			}
			var chosen []string
			check := func(step int, req Request, commit bool) {
				t.Helper()
				var open, eligible, openUS int
				var primary *entry // standby: the lowest-id eligible matching agent
				excluded := map[string]int{}
				s.mu.Lock()
				for _, e := range s.entries {
					if !e.offers(req.Action) {
						continue
					}
					switch {
					case e.p.Draining:
						excluded["draining"]++
						continue
					case !hasAll(e.p.Capabilities, req.Requires):
						excluded["missing capabilities"]++
						continue
					case e.assessed && e.factor <= 0:
						excluded[e.h.Level.String()]++
						continue
					}
					eligible++
					if !e.full() {
						open++
						if e.p.Labels["zone"] == "us" {
							openUS++
						}
					}
					if primary == nil || e.p.ID < primary.p.ID {
						primary = e
					}
				}
				primaryFull := primary != nil && primary.full()
				s.mu.Unlock()
				decide := s.Peek
				if commit {
					decide = s.Choose
				}
				p, err := decide(req)
				switch {
				case eligible == 0:
					if want := summarise(excluded); !errors.Is(err, ErrNoAgent) || errors.Is(err, ErrAtCapacity) ||
						!strings.HasSuffix(err.Error(), want) {
						t.Fatalf("step %d, %+v: no eligible agent: got %s, %v; want ErrNoAgent%s", step, req, p.ID, err, want)
					}
					return
				case open == 0 || (strategy == StrategyStandby && primaryFull):
					if !errors.Is(err, ErrAtCapacity) {
						t.Fatalf("step %d, %+v: every eligible agent (or the primary) full: got %s, %v", step, req, p.ID, err)
					}
					return
				case err != nil:
					t.Fatalf("step %d, %+v: %d open agents: %v", step, req, open, err)
				case !req.Matches(&p):
					t.Fatalf("step %d, %+v: %s does not match: %v %v", step, req, p.ID, p.Actions, p.Capabilities)
				case strategy == StrategyAffinity && openUS > 0 && p.Labels["zone"] != "us":
					t.Fatalf("step %d, %+v: affinity gave %s in zone %s while %d open agents are in us",
						step, req, p.ID, p.Labels["zone"], openUS)
				case strategy == StrategyStandby && p.ID != primary.p.ID:
					t.Fatalf("step %d, %+v: standby gave %s, the primary is %s", step, req, p.ID, primary.p.ID)
				}
				s.mu.Lock()
				e := s.entries[agentKey{"p", p.ID}]
				ok := e.open
				s.mu.Unlock()
				if !ok && !commit {
					t.Fatalf("step %d, %+v: %s is not open", step, req, p.ID)
				}
				if commit {
					chosen = append(chosen, protocol.PresenceKey(p.Pool, p.ID))
				}
			}
			for step := range 5000 {
				id := fmt.Sprintf("a%03d", rng.IntN(300))
				old, ok := present[id]
				switch r := rng.IntN(20); {
				case r < 4:
					hb := t0
					if ok {
						hb = old.HeartbeatAt.Add(time.Second)
					}
					p := randomPresence(id, hb)
					s.Observe(p)
					present[id] = p
				case r < 7: // a heartbeat: new counts or draining, same sets
					if ok {
						old.HeartbeatAt = old.HeartbeatAt.Add(time.Second)
						old.InFlight = rng.IntN(old.MaxConcurrent + 1)
						old.Draining = rng.IntN(10) == 0
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
				if step%50 == 0 {
					checkDraining(t, s, step)
				}
			}
		})
	}
}

// checkDraining holds every set's and view's draining count against its
// members.
func checkDraining(t *testing.T, s *Selector, step int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	count := func(st *set) int {
		n := 0
		for _, e := range st.all {
			if e.p.Draining {
				n++
			}
		}
		return n
	}
	for k, st := range s.sets {
		if n := count(st); st.draining != n {
			t.Fatalf("step %d: set %+v counts %d draining, its members %d", step, k, st.draining, n)
		}
	}
	for _, vs := range s.views {
		for _, v := range vs {
			if n := count(&v.set); v.draining != n {
				t.Fatalf("step %d: view %s %v %v counts %d draining, its members %d", step, v.action, v.requires, v.want, v.draining, n)
			}
		}
	}
}

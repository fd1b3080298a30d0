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

// TestCapacityMatchesScan: Capacity is a running sum kept by join, leave
// and refresh; after every one of thousands of random joins, leaves,
// updates (actions, max_concurrent, draining, labels; newer, equal and
// stale heartbeats), health changes, chooses and releases it equals, for
// every pool and action, both the walk over the action's set that Capacity
// used to be and a model the test keeps of what the selector was shown.
// (Both agree with the old code by construction: this test guards the
// running sum against drift, TestCapacityReadsNoAgent shows the walk is
// gone.)
func TestCapacityMatchesScan(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	s, err := NewWithConfig(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	pools, actions := []string{"p", "q"}, []string{"a", "b", "c"}

	// The model: per agent, the presence the selector holds (not older
	// than any seen) and the max_concurrent of the newest heartbeat (an
	// equal heartbeat replaces the presence, not the counts); health per
	// key, kept across Forget as the selector keeps it.
	type known struct {
		p  protocol.Presence
		mc int
	}
	model := map[string]*known{}
	levels := map[string]health.Level{}
	var chosen []string // keys given a task, for Release

	randomPresence := func(pool, id string, hb time.Time) protocol.Presence {
		p := protocol.Presence{ID: id, Pool: pool, HeartbeatAt: hb,
			MaxConcurrent: rng.IntN(6) - 1, // -1 and 0 count as 1
			Draining:      rng.IntN(5) == 0}
		p.InFlight = rng.IntN(max(p.MaxConcurrent, 1) + 1)
		for _, a := range actions {
			if rng.IntN(2) == 0 {
				p.Actions = append(p.Actions, a)
			}
		}
		if len(p.Actions) > 0 && rng.IntN(8) == 0 {
			p.Actions = append(p.Actions, p.Actions[0]) // listed twice: one set membership
		}
		if rng.IntN(2) == 0 {
			p.Capabilities = []string{"gpu"}
		}
		p.Labels = map[string]string{"zone": []string{"eu", "us"}[rng.IntN(2)]}
		return p
	}

	check := func(step int, op string) {
		t.Helper()
		for _, pool := range pools {
			for _, action := range append(slices.Clone(actions), "none") {
				want := 0
				for k, m := range model {
					if m.p.Pool != pool || !slices.Contains(m.p.Actions, action) || m.p.Draining {
						continue
					}
					if l, ok := levels[k]; ok && s.cfg.HealthFactors.Of(l) <= 0 {
						continue
					}
					want += max(m.mc, 1)
				}
				scan := 0 // Capacity as it was: a walk over the set
				s.mu.Lock()
				if st := s.sets[setKey{kind: kindAction, pool: pool, name: action}]; st != nil {
					for _, e := range st.all {
						if e.eligible {
							scan += max(e.c.maxConcurrent, 1)
						}
					}
				}
				s.mu.Unlock()
				if got := s.Capacity(pool, action); got != want || got != scan {
					t.Fatalf("step %d (%s): Capacity(%s, %s) = %d, scan of the set %d, model %d",
						step, op, pool, action, got, scan, want)
				}
			}
		}
	}

	for step := range 20000 {
		pool := pools[rng.IntN(len(pools))]
		id := fmt.Sprintf("a%02d", rng.IntN(30))
		key := protocol.PresenceKey(pool, id)
		m := model[key]
		var op string
		switch r := rng.IntN(10); {
		case r < 3: // a join, or a heartbeat: newer, equal or stale
			op = "observe"
			hb := t0
			if m != nil {
				hb = m.p.HeartbeatAt.Add(time.Duration(rng.IntN(3)-1) * time.Second)
			}
			p := randomPresence(pool, id, hb)
			if m != nil && rng.IntN(3) == 0 {
				// Same sets, other counts or draining.
				p.Actions, p.Capabilities, p.Labels = m.p.Actions, m.p.Capabilities, m.p.Labels
			}
			s.Observe(p)
			switch {
			case m == nil:
				model[key] = &known{p: p, mc: p.MaxConcurrent}
			case p.HeartbeatAt.After(m.p.HeartbeatAt):
				m.p, m.mc = p, p.MaxConcurrent
			case p.HeartbeatAt.Equal(m.p.HeartbeatAt):
				m.p = p
			}
		case r < 4:
			op = "forget"
			if m != nil {
				s.Forget(m.p)
				delete(model, key)
			}
		case r < 5:
			op = "set health"
			l := health.Levels()[rng.IntN(len(health.Levels()))]
			s.SetHealth(key, health.Assessment{Level: l})
			levels[key] = l
		case r < 6:
			op = "clear health"
			s.ClearHealth(key)
			delete(levels, key)
		case r < 8:
			op = "choose"
			req := Request{Pool: pool, Action: actions[rng.IntN(len(actions))]}
			if rng.IntN(4) == 0 {
				req.Requires = []string{"gpu"}
			}
			if rng.IntN(4) == 0 {
				req.Labels = map[string]string{"zone": "us"}
			}
			if rng.IntN(4) == 0 {
				req.Agent = id
			}
			if p, err := s.Choose(req); err == nil {
				chosen = append(chosen, protocol.PresenceKey(p.Pool, p.ID))
			}
		default:
			op = "release"
			if len(chosen) > 0 {
				i := rng.IntN(len(chosen))
				k := chosen[i]
				chosen = slices.Delete(chosen, i, i+1)
				at := t0.Add(time.Duration(rng.IntN(40)) * time.Second)
				if km := model[k]; km != nil {
					at = km.p.HeartbeatAt.Add(time.Duration(rng.IntN(3)-1) * time.Millisecond)
				}
				s.Release(k, at)
			}
		}
		check(step, op)
	}
	if len(model) == 0 {
		t.Fatal("no agent left at the end: the run exercised little")
	}
}

// TestCapacityReadsNoAgent: the scheduler asks Capacity for every step of
// every multi-step job, under the selector's lock; it must not walk the
// agents offering the action (5,000 entries per step at 5,000 agents) but
// read the action set's running sum. Hiding the set's members from it
// shows which: the walk finds nothing, the sum is still right.
func TestCapacityReadsNoAgent(t *testing.T) {
	t.Parallel()
	s := New()
	for i := range 5000 {
		s.Observe(protocol.Presence{ID: fmt.Sprintf("a%04d", i), Pool: "p", Actions: []string{"echo"},
			MaxConcurrent: 4, HeartbeatAt: time.Now()})
	}
	s.mu.Lock()
	st := s.sets[setKey{kind: kindAction, pool: "p", name: "echo"}]
	members := st.all
	st.all = nil
	s.mu.Unlock()
	got := s.Capacity("p", "echo")
	s.mu.Lock()
	st.all = members
	s.mu.Unlock()
	if got != 5000*4 {
		t.Fatalf("Capacity = %d with the set's members out of its reach, want %d: it walks the agents instead of keeping the sum",
			got, 5000*4)
	}
}

// TestRequiresReadsNoAgent: a step with required capabilities whose
// matching agents are all full waits, and the scheduler retries it (and
// peeks for it under a backlog) while the presence watch waits for the
// same lock; a step requiring a capability no agent has waits too. Past
// the first decision (which may build what the later ones read), neither
// answer may walk the 5,000 agents offering the action: hiding every
// set's members from the selector (each set keeps its size, its members
// are replaced by an agent of another pool) shows it. The answers are the same:
// ErrAtCapacity for the first, and for the second ErrNoAgent saying who
// lacks what. The selector used to walk the whole set for both, on every
// decision (about 130 µs each here).
func TestRequiresReadsNoAgent(t *testing.T) {
	t.Parallel()
	s := New()
	for i := range 5000 {
		s.Observe(protocol.Presence{ID: fmt.Sprintf("a%04d", i), Pool: "p", Actions: []string{"echo"},
			Capabilities: []string{"linux"}, MaxConcurrent: 4, InFlight: 4, Draining: i%500 == 0, HeartbeatAt: time.Now()})
	}
	full := Request{Pool: "p", Action: "echo", Requires: []string{"linux"}}
	none := Request{Pool: "p", Action: "echo", Requires: []string{"gpu"}}
	const why = "(excluded: 10 draining, 4990 missing capabilities)"
	check := func(when string) {
		t.Helper()
		if _, err := s.Choose(full); !errors.Is(err, ErrAtCapacity) {
			t.Fatalf("%s: every linux agent full: %v, want ErrAtCapacity", when, err)
		}
		_, err := s.Choose(none)
		if !errors.Is(err, ErrNoAgent) || errors.Is(err, ErrAtCapacity) || !strings.Contains(err.Error(), why) {
			t.Fatalf("%s: no gpu agent: %v, want ErrNoAgent %s", when, err, why)
		}
	}
	check("first decisions")

	// Each set keeps its size, but every member is a stranger (an agent of
	// another pool): a walk finds no agent to count.
	stranger := &entry{key: agentKey{"q", "stranger"}, p: protocol.Presence{ID: "stranger", Pool: "q"}}
	hide := func(st *set, hidden map[*set][]*entry) {
		hidden[st] = st.all
		st.all = make([]*entry, len(st.all))
		for i := range st.all {
			st.all[i] = stranger
		}
	}
	s.mu.Lock()
	hidden := map[*set][]*entry{}
	for _, st := range s.sets {
		hide(st, hidden)
	}
	for _, vs := range s.views {
		for _, v := range vs {
			hide(&v.set, hidden)
		}
	}
	s.mu.Unlock()
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for st, all := range hidden {
			st.all = all
		}
	})
	check("with every set's members out of its reach (a walk finds no agent)")
}

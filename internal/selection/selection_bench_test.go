package selection_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/selection"
	"github.com/wardenhq/warden/pkg/protocol"
)

func fleet(n int) []protocol.Presence {
	now := time.Now()
	out := make([]protocol.Presence, n)
	for i := range out {
		out[i] = protocol.Presence{ID: fmt.Sprintf("agent-%d", i), Pool: "default", Actions: []string{"echo", "noop", "shell"},
			Capabilities: []string{"linux"}, MaxConcurrent: 1 << 20, InFlight: i % 4, HeartbeatAt: now}
	}
	return out
}

// BenchmarkChoose is one selection decision among n present agents, as a
// dispatch makes it, on a selector fed directly (no NATS). Capacity is made
// effectively unlimited so that the decision, not a full fleet, is
// measured.
func BenchmarkChoose(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 5000} {
		agents := fleet(n)
		for _, targeted := range []bool{false, true} {
			name := fmt.Sprintf("agents_%d/any", n)
			if targeted {
				name = fmt.Sprintf("agents_%d/targeted", n)
			}
			b.Run(name, func(b *testing.B) {
				s := selection.New()
				for _, a := range agents {
					s.Observe(a)
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					req := selection.Request{Pool: "default", Action: "noop", Requires: []string{"linux"}}
					if targeted {
						req.Agent = agents[i%n].ID
					}
					i++
					if _, err := s.Choose(req); err != nil {
						b.Fatal(err)
					}
					if i%64 == 0 {
						// A heartbeat resets the assignment counts now and then.
						for j := range agents[:min(n, 64)] {
							agents[j].HeartbeatAt = agents[j].HeartbeatAt.Add(time.Second)
							s.Observe(agents[j])
						}
					}
				}
			})
		}
	}
}

// BenchmarkCapacity is the scheduler's per-step question (how many tasks
// the pool's agents offering an action may run at once): it must cost the
// same at 5,000 agents as at 50.
func BenchmarkCapacity(b *testing.B) {
	for _, n := range []int{50, 5000} {
		b.Run(fmt.Sprintf("agents_%d", n), func(b *testing.B) {
			s := selection.New()
			for _, a := range fleet(n) {
				s.Observe(a)
			}
			b.ReportAllocs()
			for b.Loop() {
				if s.Capacity("default", "noop") == 0 {
					b.Fatal("no capacity")
				}
			}
		})
	}
}

// BenchmarkChooseAffinity is one affinity decision (Peek: the state does
// not move) among 5,000 agents, half of them in zone us, for an action
// offered by some: rare_action, 1 in 10 agents offers it, half of those in
// us (the draws find them); no_free_match, 2,500 offer it, 100 of them in
// us and all full, while 2,400 other agents are open in either list: the
// draws always miss, and making sure that none matches by walking the
// smaller list cost 114 µs a decision; the query's view (built at the
// first decision) answers instead.
func BenchmarkChooseAffinity(b *testing.B) {
	cases := []struct {
		name          string
		us, act, full func(i int) bool
	}{
		{name: "rare_action", us: func(i int) bool { return i%2 == 0 }, act: func(i int) bool { return i%10 < 2 },
			full: func(int) bool { return false }},
		{name: "no_free_match", us: func(i int) bool { return i < 2500 }, act: func(i int) bool { return i >= 2400 && i < 4900 },
			full: func(i int) bool { return i >= 2400 && i < 2500 }},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			cfg := selection.DefaultConfig()
			cfg.Pools = map[string]selection.PoolConfig{"default": {Strategy: selection.StrategyAffinity}}
			s, err := selection.NewWithConfig(cfg)
			if err != nil {
				b.Fatal(err)
			}
			for i, a := range fleet(5000) {
				a.MaxConcurrent = 4
				a.InFlight = 0
				if c.full(i) {
					a.InFlight = 4
				}
				a.Labels = map[string]string{"zone": "eu"}
				if c.us(i) {
					a.Labels["zone"] = "us"
				}
				if c.act(i) {
					a.Actions = append(a.Actions, "train")
				}
				s.Observe(a)
			}
			req := selection.Request{Pool: "default", Action: "train", Labels: map[string]string{"zone": "us"}}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Peek(req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

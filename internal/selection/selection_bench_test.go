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

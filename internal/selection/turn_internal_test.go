package selection

import (
	"fmt"
	"testing"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// TestTurnsAreBounded: round_robin keeps a turn per kind of step, at most
// maxTurns of them; past that the least recently moved is dropped, and a
// kind of step in steady use keeps its turn (its agents still come in
// turn).
func TestTurnsAreBounded(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.Strategy = StrategyRoundRobin
	s, err := NewWithConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	actions := make([]string, 2*maxTurns)
	for i := range actions {
		actions[i] = fmt.Sprintf("x%04d", i)
	}
	for _, id := range []string{"a", "b", "c"} {
		s.Observe(protocol.Presence{ID: id, Pool: "p", Actions: append([]string{"hot"}, actions...),
			Capabilities: []string{"gpu"}, MaxConcurrent: 1 << 20, HeartbeatAt: time.Now()})
	}
	hot := Request{Pool: "p", Action: "hot", Requires: []string{"gpu"}}
	got := map[string]int{}
	for i, action := range actions {
		if _, err := s.Choose(Request{Pool: "p", Action: action}); err != nil {
			t.Fatal(err)
		}
		p, err := s.Choose(hot)
		if err != nil {
			t.Fatal(err)
		}
		got[p.ID]++
		s.mu.Lock()
		n := len(s.turns)
		s.mu.Unlock()
		if n > maxTurns {
			t.Fatalf("step %d: %d turns kept, at most %d", i, n, maxTurns)
		}
	}
	s.mu.Lock()
	_, kept := s.turns[turnOf(hot)]
	_, first := s.turns[turnOf(Request{Pool: "p", Action: actions[0]})]
	s.mu.Unlock()
	if !kept || first {
		t.Fatalf("after %d kinds of step: the one in use kept: %v, the first (unused since) kept: %v", len(actions), kept, first)
	}
	for _, id := range []string{"a", "b", "c"} {
		if d := got[id] - len(actions)/3; d < -1 || d > 1 {
			t.Fatalf("the kind in use, by agent: %v, want each in turn", got)
		}
	}
}

package selection

import (
	"fmt"
	"testing"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Ephemeral pools (per branch, per run) come and go: a selector forgets
// their departures once offlineMemory has passed. It kept every pool and
// action an agent ever left. (Found by a reviewer.)
//
// Old code: "selector remembers departures of 1000 pools, 25h after the
// last left".
func TestDepartedIsBounded(t *testing.T) {
	t.Parallel()
	s := New()
	now := time.Now()
	SetClock(s, func() time.Time { return now })
	for i := range 1000 {
		p := protocol.Presence{ID: "a", Pool: fmt.Sprintf("pr-%d", i), Actions: []string{"build"}, HeartbeatAt: now}
		s.Observe(p)
		s.Forget(p)
	}
	now = now.Add(25 * time.Hour) // past offlineMemory: none of it means anything now
	s.Observe(protocol.Presence{ID: "b", Pool: "main", Actions: []string{"build"}, HeartbeatAt: now})
	s.mu.Lock()
	n := len(s.departed)
	s.mu.Unlock()
	if n > 0 {
		t.Fatalf("selector remembers departures of %d pools, 25h after the last left", n)
	}
}

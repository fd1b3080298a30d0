package agent

import (
	"sync"
	"time"
)

// A cancel order for a dispatch that is not running here yet (its task
// queued behind others on the agent's consumer, or between fetch and run)
// was answered not_found and forgotten; the scheduler sends it once, and
// the task ran in full when it was pulled, after its job was cancelled.
// Such orders are kept for earlyCancelTTL, the last earlyCancelsKept of
// them, and a dispatch they name is reported cancelled unrun when it
// arrives.
const (
	earlyCancelTTL   = time.Hour
	earlyCancelsKept = 1024
)

// earlyCancels are the cancel orders for dispatches not running here, by
// "<job>.<step>.<epoch>", oldest first.
type earlyCancels struct {
	mu    sync.Mutex
	at    map[string]time.Time
	order []string
}

func newEarlyCancels() *earlyCancels { return &earlyCancels{at: map[string]time.Time{}} }

// add keeps a cancel order for key received at now.
func (c *earlyCancels) add(key string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.at[key]; !ok {
		c.order = append(c.order, key)
	}
	c.at[key] = now
	for len(c.order) > earlyCancelsKept {
		delete(c.at, c.order[0])
		c.order = c.order[1:]
	}
}

// take removes and reports a cancel order for key kept at most
// earlyCancelTTL before now.
func (c *earlyCancels) take(key string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.at[key]
	if !ok {
		return false
	}
	delete(c.at, key) // its place in order goes when it comes first
	return now.Sub(at) <= earlyCancelTTL
}

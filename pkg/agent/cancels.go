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
// arrives. An order that names the dispatch's lease token (schedulers
// send it) matches only that dispatch: a job submitted again with the
// same id after its records expired dispatches its steps at epoch 1
// again, with new tokens.
const (
	earlyCancelTTL   = time.Hour
	earlyCancelsKept = 1024
)

// earlyCancels are the cancel orders for dispatches not running here, by
// "<job>.<step>.<epoch>".
type earlyCancels struct {
	mu   sync.Mutex
	kept map[string]earlyCancel
	// order holds the keys as they were added, each with the generation
	// it was added at: a key taken and added again is trimmed by its
	// newest entry only.
	order []keptAt
	gen   uint64
}

type earlyCancel struct {
	token string
	at    time.Time
	gen   uint64
}

type keptAt struct {
	key string
	gen uint64
}

func newEarlyCancels() *earlyCancels { return &earlyCancels{kept: map[string]earlyCancel{}} }

// add keeps a cancel order for key (token: the dispatch's lease token, or
// "" for any) received at now.
func (c *earlyCancels) add(key, token string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.kept[key] = earlyCancel{token: token, at: now, gen: c.gen}
	c.order = append(c.order, keptAt{key, c.gen})
	for len(c.order) > earlyCancelsKept {
		first := c.order[0]
		c.order = c.order[1:]
		if e, ok := c.kept[first.key]; ok && e.gen == first.gen {
			delete(c.kept, first.key)
		}
	}
}

// take removes and reports a cancel order for the dispatch key with token,
// kept at most earlyCancelTTL before now.
func (c *earlyCancels) take(key, token string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.kept[key]
	if !ok || (e.token != "" && e.token != token) {
		return false
	}
	delete(c.kept, key)
	return now.Sub(e.at) <= earlyCancelTTL
}

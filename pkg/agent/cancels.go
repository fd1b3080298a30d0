package agent

import (
	"container/list"
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
// "<job>.<step>.<epoch>", the oldest first (as recentReports keeps its).
type earlyCancels struct {
	mu    sync.Mutex
	order *list.List // of *earlyCancel
	byKey map[string]*list.Element
}

type earlyCancel struct {
	key, token string
	at         time.Time
}

func newEarlyCancels() *earlyCancels {
	return &earlyCancels{order: list.New(), byKey: map[string]*list.Element{}}
}

// add keeps a cancel order for key (token: the dispatch's lease token, or
// "" for any) received at now.
func (c *earlyCancels) add(key, token string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[key]; ok {
		c.order.Remove(el)
	}
	c.byKey[key] = c.order.PushBack(&earlyCancel{key: key, token: token, at: now})
	for c.order.Len() > earlyCancelsKept {
		delete(c.byKey, c.order.Remove(c.order.Front()).(*earlyCancel).key)
	}
}

// take removes and reports a cancel order for the dispatch key with token,
// kept at most earlyCancelTTL before now.
func (c *earlyCancels) take(key, token string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[key]
	if !ok {
		return false
	}
	e := el.Value.(*earlyCancel)
	if e.token != "" && e.token != token {
		return false
	}
	c.order.Remove(el)
	delete(c.byKey, key)
	return now.Sub(e.at) <= earlyCancelTTL
}

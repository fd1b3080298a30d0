package supervisor

import (
	"context"
	"time"

	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/pkg/protocol"
)

// orderRetryMax caps the wait before a failed order is sent again: the
// first retry is on the next cycle, then the wait doubles up to this.
// An agent that does not answer costs the cycle the order's timeout
// (2 s) at most this often.
const orderRetryMax = 30 * time.Second

// holds are the orders self-healing may have in force on an agent.
type holds struct {
	drain bool // it takes no new task (drain, failover)
	limit bool // it runs at most agentCare.limit tasks at once (reduce_load)
}

// holdsOf returns what action holds the agent with.
func holdsOf(action string) holds {
	switch action {
	case ActionReduceLoad:
		return holds{limit: true}
	case ActionDrain, ActionFailover:
		return holds{drain: true}
	}
	return holds{}
}

func (h holds) union(o holds) holds {
	return holds{drain: h.drain || o.drain, limit: h.limit || o.limit}
}

// names returns h as health.Record.Held.
func (h holds) names() []string {
	var out []string
	if h.drain {
		out = append(out, health.HeldDrain)
	}
	if h.limit {
		out = append(out, health.HeldLimit)
	}
	return out
}

// agentCare is what the healer knows of one agent between cycles, and
// (state) what its warden_health record says of healing.
type agentCare struct {
	// action is the action in force: its orders were obeyed.
	action string
	// held are the orders that may be in force: held from just before
	// they are sent until the agent confirms them undone, so more than
	// action holds when an order failed (its answer may have been lost).
	held      holds
	limit     int       // the limit held.limit ordered
	drainedAt time.Time // when held.drain was first written
	moved     bool      // its queue was transferred since it was held
	failures  int       // orders and transfers failed in a row
	retryAt   time.Time // none is tried again before this
	goneAt    time.Time // when its presence was found gone; zero: present
	// record is what its warden_health record says of the agent beyond
	// healing (pool, id, last assessment): kept so that the record of an
	// agent away while held can be written again (keep).
	record health.Record
	// startedAt is the started_at of the agent process last seen; zero
	// when taken over from a record (the process then seen is taken for
	// the one that got the orders).
	startedAt time.Time
}

// restarted reports whether p is another process than the one the held
// orders went to: the agent restarted, and holds none of them.
func (c *agentCare) restarted(p protocol.Presence) bool {
	return c.held != (holds{}) && !c.startedAt.IsZero() && !p.StartedAt.Equal(c.startedAt)
}

// settled reports whether want is in force and nothing else is held.
func (c *agentCare) settled(want string) bool { return c.action == want && c.held == holdsOf(want) }

// due reports whether an order or a transfer may be tried at now: no
// failure is waiting out its backoff (half a cycle early counts, so that
// the first retry falls on the next cycle).
func (c *agentCare) due(now time.Time, cycle time.Duration) bool {
	return !now.Add(cycle / 2).Before(c.retryAt)
}

// backOff records a failure at now: the next try waits one cycle, then
// twice as long after every failure in a row, up to orderRetryMax.
func (c *agentCare) backOff(now time.Time, cycle time.Duration) {
	c.failures++
	wait := cycle
	for i := 1; i < c.failures && wait < orderRetryMax; i++ {
		wait *= 2
	}
	c.retryAt = now.Add(min(wait, orderRetryMax))
}

// moveDue says why the agent's queue is to be transferred now, or "": a
// failed agent's at once, a drained one's once the drain timeout passed
// (counted from its drain order, obeyed or not).
func (c *agentCare) moveDue(want string, now time.Time, drainTimeout time.Duration) string {
	switch {
	case c.moved:
		return ""
	case want == ActionFailover && c.action == ActionFailover:
		return "health failed"
	case want == ActionDrain && c.held.drain && now.Sub(c.drainedAt) >= drainTimeout:
		return "drain timeout passed"
	}
	return ""
}

// healingState is what an agent's health record says of healing.
type healingState struct {
	action string
	held   holds
	limit  int
}

func (c *agentCare) state() healingState {
	s := healingState{action: c.action, held: c.held}
	if c.held.limit {
		s.limit = c.limit
	}
	return s
}

// load takes over what earlier leaders put in force from the warden_health
// records: the action and the orders that may be held. A held drain's
// timeout starts again now.
func (h *healer) load(ctx context.Context, now time.Time) error {
	recs, err := h.assessor.records(ctx)
	if err != nil {
		return err
	}
	for key, r := range recs {
		c := &agentCare{action: r.Action, held: holdsOf(r.Action), limit: r.Limit, record: r}
		for _, o := range r.Held {
			switch o {
			case health.HeldDrain:
				c.held.drain = true
			case health.HeldLimit:
				c.held.limit = true
			}
		}
		if c.held.drain {
			c.drainedAt = now
		}
		h.care[key] = c
		if c.held != (holds{}) {
			h.log.Info().Str("agent", key).Str("action", c.action).Strs("held", c.held.names()).Msg("healing: taken over from warden_health")
		}
	}
	return nil
}

// departed handles an agent whose presence left (its heartbeats were
// forgotten on arrival, leader.route). One that may hold an order keeps
// its care and its record: the drain or limit lives in the agent process,
// which may be back in a moment (a pause past the presence TTL) still
// held, and must then be released once well. See keep.
func (h *healer) departed(ctx context.Context, key string) {
	if c := h.care[key]; c != nil && c.held != (holds{}) {
		if c.goneAt.IsZero() {
			c.goneAt = h.term.now()
		}
		h.assessor.unwritten(key)
		return
	}
	delete(h.care, key)
	h.assessor.forget(ctx, key)
}

// heldAwayMax bounds how long the care of an agent away while held is
// kept (keep): an agent process that comes back later still drained or
// limited is taken for one an operator drained, and left so.
const heldAwayMax = 24 * time.Hour

// keep forgets the care of the agents that are not present and hold
// nothing. The care of one away that may hold an order is kept, and its
// record in warden_health written again before the bucket's TTL removes
// it, for up to heldAwayMax: the drain or limit lives in the agent
// process, which may come back (a long pause, a partition) still held,
// and must then be released once well. Forgotten with the record, it came
// back drained with nobody knowing healing had drained it: taken for an
// operator's drain (drainedByAnother), it stayed drained for good.
func (h *healer) keep(ctx context.Context, present map[string]protocol.Presence, now time.Time) {
	for key, c := range h.care {
		if _, ok := present[key]; ok {
			c.goneAt = time.Time{}
			continue
		}
		if c.goneAt.IsZero() {
			c.goneAt = now
		}
		if c.held == (holds{}) || now.Sub(c.goneAt) > heldAwayMax {
			delete(h.care, key)
			continue
		}
		if c.record.Agent != "" {
			p := protocol.Presence{Pool: c.record.Pool, ID: c.record.Agent}
			_ = h.assessor.store(ctx, p, c.record.Assessment, c.state(), now)
		}
	}
}

// hush returns the pools whose silent agents (failed by heartbeat age
// alone, health.Assessment.Silent) heal leaves as they are this cycle,
// neither acted on nor recorded: those where more than half of the
// assessed agents are overdue with a heartbeat (Overdue, or Silent).
// Their presence is fresh, or they would not be assessed: when most of a
// pool seems to stop heartbeating at once, the leader missing their
// heartbeats is far likelier than all of them stopping while their
// presence keys live on, and acting would drain the whole pool and move
// its queues. Overdue, not only Silent, is counted because a pool falls
// silent staggered by its agents' heartbeat phases: counting the silent
// alone, the first to pass heartbeat_timeout would be failed over while
// the others were a heartbeat short of it. An agent that did stop loses
// its presence key within the presence TTL and is failed over as a
// departure (suspects), which reads its key first. One silent agent
// among live ones is failed over as before; an agent alone in its pool
// never is on heartbeat age alone.
func (h *healer) hush(assessed map[string]health.Assessment, present map[string]protocol.Presence) map[string]bool {
	total, overdue, silent := map[string]int{}, map[string]int{}, map[string]int{}
	for key, a := range assessed {
		pool := present[key].Pool
		total[pool]++
		if a.Overdue || a.Silent {
			overdue[pool]++
		}
		if a.Silent {
			silent[pool]++
		}
	}
	hushed := map[string]bool{}
	for pool, n := range silent {
		if 2*overdue[pool] > total[pool] {
			hushed[pool] = true
			if !h.hushed[pool] {
				h.log.Warn().Str("pool", pool).Int("silent", n).Int("overdue", overdue[pool]).Int("agents", total[pool]).
					Msg("healing: most of the pool is overdue with its heartbeats; failing none over on heartbeat age (presence expiry still fails over agents that are gone)")
			}
		}
	}
	for pool := range h.hushed {
		if !hushed[pool] {
			h.log.Info().Str("pool", pool).Msg("healing: the pool's heartbeats are seen again")
		}
	}
	h.hushed = hushed
	return hushed
}

package supervisor

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Healing actions, from mildest to strongest.
const (
	ActionNone         = ""
	ActionDeprioritise = "deprioritise"
	ActionReduceLoad   = "reduce_load"
	ActionDrain        = "drain"
	ActionFailover     = "failover"
)

// actionFor maps a health level to the healing action it calls for.
func actionFor(l health.Level) string {
	switch l {
	case health.Degraded:
		return ActionDeprioritise
	case health.Warning:
		return ActionReduceLoad
	case health.Critical:
		return ActionDrain
	case health.Failed:
		return ActionFailover
	}
	return ActionNone
}

// agentCare is what the healer remembers of one agent between cycles.
type agentCare struct {
	action    string
	drainedAt time.Time
	moved     bool // its remaining queue was transferred after the drain
}

// healer applies the action each agent's assessed level calls for every
// cycle: deprioritise degraded (the schedulers read the level), halve the
// concurrency of warning ones, drain critical ones (and transfer what they
// still hold after the drain timeout), fail over failed ones; and undoes
// it when the agent recovers. Every action is a "healing" event.
type healer struct {
	term         *term
	assessor     *assessor
	ops          *ops.Ops
	failover     *failover
	selfHealing  bool
	drainTimeout time.Duration
	cycle        time.Duration
	log          zerolog.Logger
	care         map[string]*agentCare
}

// run assesses every cycle until ctx ends. Presence updates arrive on
// beats, departures on gone.
func (h *healer) run(ctx context.Context, beats <-chan protocol.Presence, gone <-chan string) error {
	h.assessor.seed(h.term.now())
	tick := time.NewTicker(h.cycle)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case p := <-beats:
			h.assessor.heartbeat(p, h.term.now())
		case key := <-gone:
			delete(h.care, key)
			h.assessor.forget(ctx, key)
		case <-tick.C:
			if err := h.term.fence(); err != nil {
				continue // the next cycle; see recovery.due
			}
			start := time.Now()
			h.heal(ctx, h.term.now())
			h.failover.metrics.healingCycle.Observe(time.Since(start).Seconds()) // operator's edit: warden_healing_cycle_duration_seconds
		}
	}
}

// heal runs one cycle at now.
func (h *healer) heal(ctx context.Context, now time.Time) {
	assessed, present, ok := h.assessor.assess(now)
	if !ok {
		return // blind: judge nobody until the view is fresh again
	}
	for key, a := range assessed {
		p := present[key]
		c := h.care[key]
		if c == nil {
			c = &agentCare{}
			h.care[key] = c
		}
		want := ActionNone
		if h.selfHealing {
			want = actionFor(a.Level)
		}
		if want != c.action {
			h.apply(ctx, p, c, want, a)
		} else if want == ActionDrain && !c.moved && now.Sub(c.drainedAt) >= h.drainTimeout {
			// Drained long enough: transfer what it still holds.
			c.moved = true
			h.transfer(ctx, p, "drain timeout passed")
		}
		h.assessor.store(ctx, p, a, c.action, now)
	}
}

// apply moves an agent from its current action to want.
func (h *healer) apply(ctx context.Context, p protocol.Presence, c *agentCare, want string, a health.Assessment) {
	from := c.action
	err := h.term.control(func() error { return h.order(ctx, p, from, want) })
	switch want {
	case ActionDrain:
		c.drainedAt, c.moved = h.term.now(), false
	case ActionFailover:
		// A failed agent may not answer the drain; its queue moves anyway.
		if !errors.Is(err, errNotLeader) {
			h.transfer(ctx, p, "health failed")
		}
	}
	c.action = want
	h.record(ctx, p, from, want, a, err)
}

// order sends the agent the orders that take it from action from to want.
func (h *healer) order(ctx context.Context, p protocol.Presence, from, want string) error {
	var err error
	// Undo what the previous action did that the new one does not.
	if from == ActionReduceLoad && want != ActionReduceLoad {
		err = h.ops.LimitAgent(ctx, p.Pool, p.ID, 0)
	}
	if (from == ActionDrain || from == ActionFailover) && want != ActionDrain && want != ActionFailover {
		err = h.ops.UndrainAgent(ctx, p.Pool, p.ID)
	}
	switch want {
	case ActionReduceLoad:
		err = h.ops.LimitAgent(ctx, p.Pool, p.ID, max(1, p.MaxConcurrent/2))
	case ActionDrain, ActionFailover:
		err = h.ops.DrainAgent(ctx, p.Pool, p.ID)
	}
	return err
}

func (h *healer) transfer(ctx context.Context, p protocol.Presence, why string) {
	trigger := "health:" + why + ":" + p.HeartbeatAt.UTC().Format(time.RFC3339Nano)
	rec, err := h.failover.transferLive(ctx, p.Pool, p.ID, trigger) // p is present: its tasks are no suspects
	if err == nil && rec.TasksMoved > 0 {
		h.assessor.lostTasks(protocol.PresenceKey(p.Pool, p.ID), rec.TasksMoved, h.term.now())
	}
	h.log.Warn().Str("agent", p.ID).Str("why", why).Int("tasks_moved", rec.TasksMoved).Err(err).Msg("healing: queue transferred")
}

// record adds the healing history entry (event kind "healing").
func (h *healer) record(ctx context.Context, p protocol.Presence, from, to string, a health.Assessment, err error) {
	outcome := "done"
	if err != nil {
		outcome = "failed: " + err.Error()
	}
	action := to
	if to == ActionNone {
		action = "restore"
	}
	h.log.Warn().Str("agent", p.ID).Str("pool", p.Pool).Str("action", action).Str("from", from).
		Str("level", a.Level.String()).Float64("score", a.Score).Strs("reasons", a.Reasons).Str("outcome", outcome).Msg("healing")
	_ = h.term.event(ctx, protocol.Event{Kind: protocol.EventHealing, ID: p.ID, Agent: p.ID, Reason: strings.Join(a.Reasons, "; "),
		Data: map[string]string{"action": action, "from": from, "pool": p.Pool, "level": a.Level.String(),
			"score": strconv.FormatFloat(a.Score, 'f', 3, 64), "outcome": outcome,
			"heartbeat_at": p.HeartbeatAt.UTC().Format(time.RFC3339Nano)}})
}

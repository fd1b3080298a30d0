package supervisor

import (
	"context"
	"errors"
	"fmt"
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

// healer applies the action each agent's assessed level calls for every
// cycle: deprioritise degraded (the schedulers read the level), halve the
// concurrency of warning ones, drain critical ones (and transfer what they
// still hold after the drain timeout), fail over failed ones; and undoes
// it when the agent recovers. Every action is a "healing" event.
//
// What healing puts in force outlives the leader that ordered it: an agent
// keeps a drain or a limit until it is told otherwise (pkg/agent), whoever
// leads by then. So the orders that may be in force on an agent
// (agentCare.held) are written to its warden_health record before they are
// sent and taken off only when the agent confirms them undone; a new
// leader starts from those records (load), and an agent whose presence
// lapsed for a moment is remembered until it is back (keep). An order that
// failed is sent again on a later cycle, backing off from an agent that
// does not answer (agentCare.backOff); the action is in force only once
// its orders were obeyed.
//
// Heartbeats reach the tracker as they arrive (leader.route), stamped
// there, never through this loop: a slow cycle (orders to agents that do
// not answer, a large transfer) ages nobody's heartbeat. And heartbeat age
// alone fails over no agent while most of its pool is overdue with its
// heartbeats too (hush).
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
	loaded       bool            // care was taken over from warden_health
	hushed       map[string]bool // the pools hush left alone last cycle
}

// run assesses every cycle until ctx ends. Departures arrive on gone.
func (h *healer) run(ctx context.Context, gone <-chan string) error {
	h.assessor.seed(h.term.now())
	tick := time.NewTicker(h.cycle)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case key := <-gone:
			h.departed(ctx, key)
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
	if !h.loaded {
		// Judge nobody before knowing what is in force: an agent a
		// previous leader drained would be taken for one never drained.
		if err := h.load(ctx, now); err != nil {
			h.log.Warn().Err(err).Msg("healing records not read; healing waits for them")
			return
		}
		h.loaded = true
	}
	assessed, present, ok := h.assessor.assess(now)
	if !ok {
		return // blind: judge nobody until the view is fresh again
	}
	h.keep(ctx, present, now)
	hushed := h.hush(assessed, present)
	for key, a := range assessed {
		if ctx.Err() != nil {
			return // the term ended: orders would fail and be recorded as failed
		}
		p := present[key]
		if a.Silent && hushed[p.Pool] {
			continue // neither acted on nor recorded; see hush
		}
		c := h.care[key]
		if c == nil {
			c = &agentCare{}
			h.care[key] = c
		}
		if c.restarted(p) {
			// A new process holds none of the orders the old one did.
			h.log.Info().Str("agent", p.ID).Str("pool", p.Pool).Strs("held", c.held.names()).Msg("healing: agent restarted; its orders are gone")
			*c = agentCare{}
		}
		c.startedAt = p.StartedAt
		want := ActionNone
		if h.selfHealing {
			want = actionFor(a.Level)
		}
		if !c.settled(want) && c.due(now, h.cycle) && !drainedByAnother(p, c, want) {
			h.apply(ctx, p, c, want, a, now)
		}
		if why := c.moveDue(want, now, h.drainTimeout); why != "" && c.due(now, h.cycle) {
			h.move(ctx, p, c, why, now)
		}
		c.record = health.Record{Agent: p.ID, Pool: p.Pool, Assessment: a}
		_ = h.assessor.store(ctx, p, a, c.state(), now)
	}
}

// drainedByAnother says the agent is drained by someone other than
// healing (an operator's `warden agent drain`), and want would drain or
// limit it: healing leaves it alone and takes no hold. Taking one, it
// undrained the agent once it recovered (the agent keeps one drain flag,
// whoever set it), putting back in service a host an operator had taken
// out. A failover still goes ahead: the agent's queue must move.
func drainedByAnother(p protocol.Presence, c *agentCare, want string) bool {
	return p.Draining && !c.held.drain && (want == ActionDrain || want == ActionReduceLoad)
}

// apply sends the orders that take the agent from what it may hold to what
// want calls for, and records the attempt as a healing event. want is in
// force once they were obeyed; a failover is in force once ordered (a
// failed agent may not answer the drain; its queue moves anyway).
func (h *healer) apply(ctx context.Context, p protocol.Presence, c *agentCare, want string, a health.Assessment, now time.Time) {
	from, keep := c.action, holdsOf(want)
	if next := c.held.union(keep); next != c.held {
		// Written ahead of the order: a leader that takes over after it
		// was sent must know that it may be in force.
		ahead := *c
		ahead.held = next
		if next.drain && !c.held.drain {
			ahead.drainedAt, ahead.moved = now, false
		}
		if next.limit && !c.held.limit {
			ahead.limit = max(1, p.MaxConcurrent/2)
		}
		if err := h.assessor.store(ctx, p, a, ahead.state(), now); err != nil {
			h.log.Warn().Err(err).Str("agent", p.ID).Str("pool", p.Pool).Str("action", want).
				Msg("healing: order not sent, its hold could not be recorded")
			c.backOff(now, h.cycle)
			return
		}
		*c = ahead
	}
	err := h.term.control(func() error { return h.order(ctx, p, c, keep) })
	if errors.Is(err, errNotLeader) {
		return // deposed: the next leader takes over from the records
	}
	if err == nil || want == ActionFailover {
		c.action, c.failures, c.retryAt = want, 0, time.Time{}
	} else {
		c.backOff(now, h.cycle)
	}
	h.record(ctx, p, from, want, a, err)
}

// order releases what the agent may hold that keep does not, and sends
// (again) what keep holds. A release the agent confirms is held no more;
// every error is returned.
func (h *healer) order(ctx context.Context, p protocol.Presence, c *agentCare, keep holds) error {
	var errs []error
	if c.held.limit && !keep.limit {
		if err := h.ops.LimitAgent(ctx, p.Pool, p.ID, 0); err != nil {
			errs = append(errs, fmt.Errorf("restore concurrency: %w", err))
		} else {
			c.held.limit, c.limit = false, 0
		}
	}
	if c.held.drain && !keep.drain {
		if err := h.ops.UndrainAgent(ctx, p.Pool, p.ID); err != nil {
			errs = append(errs, fmt.Errorf("undrain: %w", err))
		} else {
			c.held.drain, c.drainedAt, c.moved = false, time.Time{}, false
		}
	}
	if keep.limit {
		if err := h.ops.LimitAgent(ctx, p.Pool, p.ID, c.limit); err != nil {
			errs = append(errs, fmt.Errorf("limit to %d: %w", c.limit, err))
		}
	}
	if keep.drain {
		if err := h.ops.DrainAgent(ctx, p.Pool, p.ID); err != nil {
			errs = append(errs, fmt.Errorf("drain: %w", err))
		}
	}
	return errors.Join(errs...)
}

// move transfers the queue of a drained or failed agent.
func (h *healer) move(ctx context.Context, p protocol.Presence, c *agentCare, why string, now time.Time) {
	if err := h.transfer(ctx, p, why); err != nil {
		c.backOff(now, h.cycle)
		return
	}
	c.moved, c.failures, c.retryAt = true, 0, time.Time{}
}

func (h *healer) transfer(ctx context.Context, p protocol.Presence, why string) error {
	trigger := "health:" + why + ":" + p.HeartbeatAt.UTC().Format(time.RFC3339Nano)
	// The moved tasks are not counted against the agent (as lost): healing
	// moves them because of how the agent was judged, and counting them
	// judged it again by its own verdict, keeping an agent that recovered
	// critical for the window.
	rec, err := h.failover.transferLive(ctx, p.Pool, p.ID, trigger) // p is present: its tasks are no suspects
	h.log.Warn().Str("agent", p.ID).Str("why", why).Int("tasks_moved", rec.TasksMoved).Err(err).Msg("healing: queue transferred")
	return err
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

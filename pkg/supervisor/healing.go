package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/wardenhq/warden/pkg/config"
	"github.com/wardenhq/warden/pkg/health"
	"github.com/wardenhq/warden/pkg/ops"
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

// loadHealthConfig decodes the health file onto the defaults.
func (c Config) loadHealthConfig() (health.Config, error) {
	hc := health.DefaultConfig()
	if err := config.Load(c.HealthConfig, &hc); err != nil {
		return hc, fmt.Errorf("health_config %s: %w", c.HealthConfig, err)
	}
	hc = hc.WithDefaults()
	if err := hc.Validate(); err != nil {
		return hc, fmt.Errorf("health_config %s: %w", c.HealthConfig, err)
	}
	return hc, nil
}

// agentCare is what the leader remembers of one agent between cycles.
type agentCare struct {
	action    string
	level     health.Level
	score     float64
	written   time.Time
	drainedAt time.Time
	moved     bool // its remaining queue was transferred after the drain
}

// healer assesses agents every cycle, stores the assessments for the
// schedulers and the CLI, and applies the healing action each level calls
// for. Every action is an event in the healing history.
type healer struct {
	l       *leader
	tracker *health.Tracker
	kv      jetstream.KeyValue
	ops     *ops.Ops
	care    map[string]*agentCare
}

func (l *leader) newHealer(ctx context.Context) (*healer, error) {
	hc, err := l.cfg.loadHealthConfig()
	if err != nil {
		return nil, err
	}
	tr, err := health.NewTracker(hc)
	if err != nil {
		return nil, err
	}
	kv, err := l.js.KeyValue(ctx, protocol.BucketHealth)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", protocol.BucketHealth, err)
	}
	return &healer{l: l, tracker: tr, kv: kv, ops: ops.New(l.nc, l.store), care: map[string]*agentCare{}}, nil
}

// run assesses every cycle until ctx ends. Presence changes arrive on
// beats; lost tasks (transferred from failed agents) on lost.
func (h *healer) run(ctx context.Context, beats <-chan protocol.Presence, gone <-chan string) error {
	for _, p := range h.l.view.Agents() {
		h.tracker.Heartbeat(p, h.l.now())
	}
	tick := time.NewTicker(h.l.cfg.CycleInterval.Std())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case p := <-beats:
			h.tracker.Heartbeat(p, h.l.now())
		case key := <-gone:
			h.tracker.Forget(key)
			delete(h.care, key)
			_ = h.kv.Delete(ctx, key)
		case <-tick.C:
			if err := h.l.fence(); err != nil {
				return nil
			}
			h.cycle(ctx, h.l.now())
		}
	}
}

func (h *healer) cycle(ctx context.Context, now time.Time) {
	present := map[string]protocol.Presence{}
	for _, p := range h.l.view.Agents() {
		present[protocol.PresenceKey(p.Pool, p.ID)] = p
	}
	for key, a := range h.tracker.AssessAll(now) {
		p, ok := present[key]
		if !ok {
			continue // gone: presence expiry and failover handle it
		}
		c := h.care[key]
		if c == nil {
			c = &agentCare{}
			h.care[key] = c
		}
		want := ActionNone
		if h.l.cfg.SelfHealing {
			want = actionFor(a.Level)
		}
		if want != c.action {
			h.apply(ctx, p, c, want, a)
		} else if want == ActionDrain && !c.moved && now.Sub(c.drainedAt) >= h.l.cfg.DrainTimeout.Std() {
			// Drained long enough: transfer what it still holds.
			c.moved = true
			h.failover(ctx, p, a, "drain timeout passed")
		}
		if a.Level != c.level || math.Abs(a.Score-c.score) >= 0.05 || now.Sub(c.written) >= 30*time.Second || want != c.action {
			h.write(ctx, p, a, c.action)
			c.level, c.score, c.written = a.Level, a.Score, now
		}
	}
}

// apply moves an agent from its current action to want.
func (h *healer) apply(ctx context.Context, p protocol.Presence, c *agentCare, want string, a health.Assessment) {
	from := c.action
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
	case ActionDrain:
		err = h.ops.DrainAgent(ctx, p.Pool, p.ID)
		c.drainedAt, c.moved = h.l.now(), false
	case ActionFailover:
		err = h.ops.DrainAgent(ctx, p.Pool, p.ID)
		h.failover(ctx, p, a, "health failed")
	}
	c.action = want
	h.record(ctx, p, from, want, a, err)
}

func (h *healer) failover(ctx context.Context, p protocol.Presence, a health.Assessment, why string) {
	rec, err := h.l.failoverRecord(ctx, suspect{presence: p, since: h.l.now()})
	if err == nil && rec.TasksMoved > 0 {
		h.tracker.RecordLost(protocol.PresenceKey(p.Pool, p.ID), rec.TasksMoved, h.l.now())
	}
	h.l.log.Warn().Str("agent", p.ID).Str("why", why).Int("tasks_moved", rec.TasksMoved).Err(err).Msg("healing: queue transferred")
}

// write stores the assessment where schedulers and the CLI read it.
func (h *healer) write(ctx context.Context, p protocol.Presence, a health.Assessment, action string) {
	if h.l.fence() != nil {
		return
	}
	r := health.Record{Agent: p.ID, Pool: p.Pool, Assessment: a, Action: action}
	b, _ := json.Marshal(r)
	if _, err := h.kv.Put(ctx, r.Key(), b); err != nil {
		h.l.log.Warn().Err(err).Str("agent", r.Key()).Msg("health record not stored")
	}
}

// HealingEvent is the healing history entry (event kind "healing").
func (h *healer) record(ctx context.Context, p protocol.Presence, from, to string, a health.Assessment, err error) {
	outcome := "done"
	if err != nil {
		outcome = "failed: " + err.Error()
	}
	action := to
	if to == ActionNone {
		action = "restore"
	}
	h.l.log.Warn().Str("agent", p.ID).Str("pool", p.Pool).Str("action", action).Str("from", from).
		Str("level", a.Level.String()).Float64("score", a.Score).Strs("reasons", a.Reasons).Str("outcome", outcome).Msg("healing")
	_ = h.l.events.Publish(ctx, protocol.Event{Kind: "healing", ID: nuid.Next(), Agent: p.ID, Reason: strings.Join(a.Reasons, "; "),
		Data: map[string]string{"action": action, "from": from, "pool": p.Pool, "level": a.Level.String(),
			"score": strconv.FormatFloat(a.Score, 'f', 3, 64), "outcome": outcome}})
}

package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/config"
	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/pkg/protocol"
)

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

// assessor assesses the present agents from their heartbeats and stores
// each assessment in warden_health for the schedulers and the CLI. It
// judges nobody while sight is not clear: an agent whose heartbeats the
// leader could not see is not an agent that stopped sending them.
type assessor struct {
	term    *term
	tracker *health.Tracker
	kv      jetstream.KeyValue
	view    *presence.View
	sight   *sight
	log     zerolog.Logger

	written map[string]written
}

// written is the last assessment stored for an agent.
type written struct {
	level  health.Level
	score  float64
	action string
	at     time.Time
}

func newAssessor(ctx context.Context, t *term, hc health.Config, view *presence.View, s *sight, log zerolog.Logger) (*assessor, error) {
	tr, err := health.NewTracker(hc)
	if err != nil {
		return nil, err
	}
	kv, err := t.js.KeyValue(ctx, protocol.BucketHealth)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", protocol.BucketHealth, err)
	}
	return &assessor{term: t, tracker: tr, kv: kv, view: view, sight: s, log: log, written: map[string]written{}}, nil
}

// seed starts tracking the agents present in the (ready) view at now.
func (a *assessor) seed(now time.Time) {
	for _, p := range a.view.Agents() {
		a.tracker.Heartbeat(p, now)
	}
}

// heartbeat records a presence update received at now.
func (a *assessor) heartbeat(p protocol.Presence, now time.Time) { a.tracker.Heartbeat(p, now) }

// forget drops an agent that left, with its stored assessment.
func (a *assessor) forget(ctx context.Context, key string) {
	a.tracker.Forget(key)
	delete(a.written, key)
	_ = a.term.kvDelete(ctx, a.kv, key)
}

// lostTasks counts tasks a failover took from the agent as failures.
func (a *assessor) lostTasks(key string, n int, now time.Time) { a.tracker.RecordLost(key, n, now) }

// assess returns the present agents' assessments at now, or false when the
// leader cannot trust what it saw (see sight).
func (a *assessor) assess(now time.Time) (map[string]health.Assessment, map[string]protocol.Presence, bool) {
	present := map[string]protocol.Presence{}
	for _, p := range a.view.Agents() {
		present[protocol.PresenceKey(p.Pool, p.ID)] = p
	}
	if clear, _ := a.sight.clear(now); !clear {
		return nil, nil, false
	}
	out := map[string]health.Assessment{}
	for key, as := range a.tracker.AssessAll(now) {
		if _, ok := present[key]; ok {
			out[key] = as // gone: presence expiry and failover handle it
		}
	}
	return out, present, true
}

// store writes an agent's assessment when it changed enough or is old.
func (a *assessor) store(ctx context.Context, p protocol.Presence, as health.Assessment, action string, now time.Time) {
	key := protocol.PresenceKey(p.Pool, p.ID)
	w := a.written[key]
	if as.Level == w.level && math.Abs(as.Score-w.score) < 0.05 && now.Sub(w.at) < 30*time.Second && action == w.action && !w.at.IsZero() {
		return
	}
	r := health.Record{Agent: p.ID, Pool: p.Pool, Assessment: as, Action: action}
	b, _ := json.Marshal(r)
	if err := a.term.kvPut(ctx, a.kv, r.Key(), b); err != nil {
		a.log.Warn().Err(err).Str("agent", r.Key()).Msg("health record not stored")
		return
	}
	a.written[key] = written{level: as.Level, score: as.Score, action: action, at: now}
}

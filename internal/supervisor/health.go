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
	tracker *health.Tracker // fed by the presence watch (heartbeat), read by the healer
	kv      jetstream.KeyValue
	view    *presence.View
	sight   *sight
	log     zerolog.Logger
	// recordTTL is how long warden_health keeps the record of an agent
	// nobody writes any more (the bucket's TTL).
	recordTTL time.Duration

	written map[string]written // the healer's goroutine only
}

// written is the last assessment stored for an agent.
type written struct {
	level   health.Level
	score   float64
	healing healingState
	at      time.Time
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
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s status: %w", protocol.BucketHealth, err)
	}
	ttl := st.TTL()
	if ttl <= 0 {
		ttl = 2 * time.Minute // kv_health.json's; a bucket that keeps records for ever must not keep care for ever
	}
	return &assessor{term: t, tracker: tr, kv: kv, view: view, sight: s, log: log, recordTTL: ttl, written: map[string]written{}}, nil
}

// seed starts tracking the agents present in the (ready) view at now,
// those the presence watch has not brought (leader.route) meanwhile
// (Tracker.Seed).
func (a *assessor) seed(now time.Time) {
	for _, p := range a.view.Agents() {
		a.tracker.Seed(p, now)
	}
}

// heartbeat records a presence update received at now. The presence
// watch calls it as the update arrives (leader.route).
func (a *assessor) heartbeat(p protocol.Presence, now time.Time) { a.tracker.Heartbeat(p, now) }

// left forgets the heartbeats of an agent whose presence left. The
// presence watch calls it, in order with heartbeat.
func (a *assessor) left(key string) { a.tracker.Forget(key) }

// forget drops the stored assessment of an agent that left.
func (a *assessor) forget(ctx context.Context, key string) {
	delete(a.written, key)
	_ = a.term.kvDelete(ctx, a.kv, key)
}

// unwritten keeps the stored assessment of an agent that left but makes
// the next store write it again.
func (a *assessor) unwritten(key string) { delete(a.written, key) }

// records reads every stored record, by key.
func (a *assessor) records(ctx context.Context) (map[string]health.Record, error) {
	return health.Records(ctx, a.kv)
}

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

// store writes an agent's assessment and healing state when either
// changed (the assessment enough) or the record is old: written 30 s ago,
// or half the bucket's TTL if that is shorter, so that it never expires
// while it is kept.
func (a *assessor) store(ctx context.Context, p protocol.Presence, as health.Assessment, hs healingState, now time.Time) error {
	key := protocol.PresenceKey(p.Pool, p.ID)
	w := a.written[key]
	old := now.Sub(w.at) >= min(30*time.Second, a.recordTTL/2)
	if as.Level == w.level && math.Abs(as.Score-w.score) < 0.05 && !old && hs == w.healing && !w.at.IsZero() {
		return nil
	}
	r := health.Record{Agent: p.ID, Pool: p.Pool, Assessment: as, Action: hs.action, Held: hs.held.names(), Limit: hs.limit}
	b, _ := json.Marshal(r)
	if err := a.term.kvPut(ctx, a.kv, r.Key(), b); err != nil {
		a.log.Warn().Err(err).Str("agent", r.Key()).Msg("health record not stored")
		return err
	}
	a.written[key] = written{level: as.Level, score: as.Score, healing: hs, at: now}
	return nil
}

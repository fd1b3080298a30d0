package supervisor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/internal/lease"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// LeaseKey is the supervisors' key in the leases bucket.
const LeaseKey = "supervisor"

// Supervisor is one supervisor process.
type Supervisor struct {
	cfg     Config
	nc      *nats.Conn
	js      jetstream.JetStream
	log     zerolog.Logger
	metrics *Metrics
	now     func() time.Time
	// health is health_config as New read it: every term uses it, so a
	// file that went bad after start cannot stop a term (and, the lease
	// still renewed, keep every standby from taking over).
	health health.Config
	// leading is closed the first time this supervisor leads with every
	// duty running (its recovery index built).
	leading     chan struct{}
	leadingOnce sync.Once
}

// Leading is closed once this supervisor has led with every duty running
// (its recovery index built from the whole job store): a readiness signal.
func (s *Supervisor) Leading() <-chan struct{} { return s.leading }

// New validates cfg and returns a supervisor on nc.
func New(cfg Config, nc *nats.Conn, log zerolog.Logger, m *Metrics) (*Supervisor, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("supervisor config: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	hc, err := cfg.loadHealthConfig()
	if err != nil {
		return nil, fmt.Errorf("supervisor config: %w", err)
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Supervisor{cfg: cfg, nc: nc, js: js, log: log.With().Str("supervisor_id", cfg.ID).Logger(), metrics: m, now: time.Now,
		health: hc, leading: make(chan struct{})}, nil
}

// Run ensures the streams, then campaigns for leadership until ctx ends.
// It returns nil when ctx ends, even while it is still starting.
func (s *Supervisor) Run(ctx context.Context) (err error) {
	defer func() {
		if err != nil && ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			err = nil // stopped while starting: a shutdown, not a failure
		}
	}()
	if err := streams.Ensure(ctx, s.js, s.cfg.streamOptions()); err != nil {
		return err
	}
	ops.ServeMicro(ctx, s.nc, ops.ServiceSupervisor, s.log) // nats micro ls: warden-supervisor (operator's edit)
	kv, err := s.js.KeyValue(ctx, protocol.BucketLeases)
	if err != nil {
		return fmt.Errorf("open leases bucket: %w", err)
	}
	el, err := lease.New(kv, lease.Config{Key: LeaseKey, ID: s.cfg.ID, TTL: s.cfg.LeaseTTL.Std()}, s.log)
	if err != nil {
		return err
	}
	s.log.Info().Dur("lease_ttl", s.cfg.LeaseTTL.Std()).Msg("supervisor campaigning")
	return el.Run(ctx, func(ctx context.Context, epoch uint64) {
		// A term that fails (a watch broke, say) is retried while the
		// lease is held; losing the lease cancels ctx.
		for ctx.Err() == nil {
			if err := s.leadTerm(ctx, el, epoch); err != nil {
				s.log.Error().Err(err).Msg("leader loop failed; restarting it")
				sleepCtx(ctx, s.cfg.RecoveryRetry.Std())
			}
		}
	})
}

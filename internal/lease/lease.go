package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Holder is the value stored under the lease key.
type Holder struct {
	ID      string    `json:"id"`
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Renewed time.Time `json:"renewed"`
}

// Config configures an Elector.
type Config struct {
	// Key in the bucket, e.g. "supervisor".
	Key string
	// ID names this candidate.
	ID string
	// TTL is the bucket's TTL: how long a dead leader keeps the lease.
	TTL time.Duration
	// RenewEvery defaults to 75% of TTL.
	RenewEvery time.Duration
}

// Elector campaigns for a lease and runs work while it holds it.
type Elector struct {
	kv  jetstream.KeyValue
	cfg Config
	log zerolog.Logger
	now func() time.Time

	mu      sync.Mutex
	epoch   uint64
	validTo time.Time
}

// New returns an elector on bucket kv.
func New(kv jetstream.KeyValue, cfg Config, log zerolog.Logger) (*Elector, error) {
	if cfg.Key == "" || cfg.ID == "" {
		return nil, errors.New("lease: key and id are required")
	}
	if cfg.TTL <= 0 {
		return nil, errors.New("lease: ttl must be positive")
	}
	if cfg.RenewEvery <= 0 {
		cfg.RenewEvery = cfg.TTL * 3 / 4
	}
	if cfg.RenewEvery >= cfg.TTL {
		return nil, fmt.Errorf("lease: renew_every (%s) must be shorter than the ttl (%s)", cfg.RenewEvery, cfg.TTL)
	}
	return &Elector{kv: kv, cfg: cfg, log: log, now: time.Now}, nil
}

// Leader reports the fencing epoch while this elector holds the lease and
// its last renewal is younger than the TTL. Check it before every write
// that only the leader may make.
func (e *Elector) Leader() (uint64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.epoch == 0 || !e.now().Before(e.validTo) {
		return 0, false
	}
	return e.epoch, true
}

// Run campaigns until ctx ends. Each time it wins, lead runs with a context
// cancelled when leadership is lost; Run waits for lead to return before
// campaigning again. On exit a held lease is released so a standby takes
// over without waiting for the TTL.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context, epoch uint64)) error {
	for {
		rev, err := e.campaign(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		e.hold(ctx, rev, lead)
		if ctx.Err() != nil {
			return nil
		}
	}
}

func (e *Elector) value() []byte {
	host, _ := os.Hostname()
	b, _ := json.Marshal(Holder{ID: e.cfg.ID, Host: host, PID: os.Getpid(), Renewed: e.now().UTC()})
	return b
}

// campaign returns the revision of a won Create.
func (e *Elector) campaign(ctx context.Context) (uint64, error) {
	w, err := e.kv.Watch(ctx, e.cfg.Key, jetstream.UpdatesOnly())
	if err != nil {
		return 0, fmt.Errorf("watch lease %s: %w", e.cfg.Key, err)
	}
	defer func() { _ = w.Stop() }()
	retry := time.NewTimer(0)
	defer retry.Stop()
	logged := false
	updates := w.Updates()
	for {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-retry.C:
		case u, ok := <-updates:
			if !ok {
				// The watch ended (its connection closed): a closed channel
				// is always ready and the loop spun a core. The timer
				// campaigns from now on.
				updates = nil
				continue
			}
			if u == nil || u.Operation() == jetstream.KeyValuePut {
				continue
			}
			// Deleted or expired: campaign now.
		}
		start := e.now()
		rev, err := e.kv.Create(ctx, e.cfg.Key, e.value())
		if err == nil {
			e.mu.Lock()
			e.epoch, e.validTo = rev, start.Add(e.cfg.TTL)
			e.mu.Unlock()
			return rev, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			e.log.Warn().Err(err).Msg("lease campaign failed; retrying")
		} else if !logged {
			if cur, gerr := e.kv.Get(ctx, e.cfg.Key); gerr == nil {
				e.log.Info().RawJSON("leader", cur.Value()).Msg("standing by")
			}
			logged = true
		}
		// The watch normally wakes us; the timer covers a missed marker.
		retry.Stop()
		retry.Reset(e.cfg.TTL / 4)
	}
}

// hold runs lead and renews the lease until a renewal fails or ctx ends.
func (e *Elector) hold(ctx context.Context, rev uint64, lead func(context.Context, uint64)) {
	epoch := rev
	e.log.Info().Uint64("epoch", epoch).Msg("elected leader")
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lead(lctx, epoch)
	}()
	defer func() {
		cancel()
		<-done
		e.mu.Lock()
		e.epoch = 0
		e.mu.Unlock()
	}()
	tick := time.NewTicker(e.cfg.RenewEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			// Stop leading first, then release so a standby need not
			// wait for the TTL.
			cancel()
			<-done
			rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
			_ = e.kv.Delete(rctx, e.cfg.Key, jetstream.LastRevision(rev))
			rcancel()
			e.log.Info().Uint64("epoch", epoch).Msg("released leadership")
			return
		case <-done:
			return
		case <-tick.C:
			start := e.now()
			rctx, rcancel := context.WithTimeout(ctx, e.cfg.TTL-e.cfg.RenewEvery)
			nrev, err := e.kv.Update(rctx, e.cfg.Key, e.value(), rev)
			rcancel()
			if err != nil {
				e.log.Warn().Err(err).Uint64("epoch", epoch).Msg("lease renewal failed; stepping down")
				return
			}
			rev = nrev
			e.mu.Lock()
			e.validTo = start.Add(e.cfg.TTL)
			e.mu.Unlock()
		}
	}
}

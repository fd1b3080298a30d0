package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/protocol"
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
	if !protocol.ValidKVKey(cfg.Key) {
		return nil, fmt.Errorf("lease: key %q is not a valid key: letters, digits and - / _ = in dot-separated tokens", cfg.Key)
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
//
// Run returns nil when ctx ends. Every other failure (the server down or
// restarting, a request timing out, JetStream not ready yet) is retried
// with a backoff, however long it lasts: the connection reconnects forever
// and so does the campaign. Run returns an error only for a failure that
// no retry can mend (see permanent): the connection was closed by its
// owner, or the key is one the server refuses.
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

// permanent reports whether err is a failure no retry can mend: a closed
// connection never reconnects (its owner closed it, or it gave up), and an
// invalid key (New checks it; this is a safety net should the server's
// rule be stricter) is refused every time.
func permanent(err error) bool {
	return errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, jetstream.ErrInvalidKey)
}

// retryDelay is how long campaign waits before its next Create after
// failures consecutive failures (0: the last attempt found the key held).
// A held key is tried again every TTL/4 (the watch normally wakes the
// candidate sooner; the timer covers a missed marker). Failures back off
// from 50 ms, doubling up to the same TTL/4, so a candidate whose server
// just came back campaigns at once and one whose server stays down does
// not hammer it.
func retryDelay(ttl time.Duration, failures int) time.Duration {
	ceiling := max(ttl/4, minRetry)
	if failures <= 0 {
		return ceiling
	}
	d := minRetry
	for i := 1; i < failures && d < ceiling; i++ {
		d *= 2
	}
	return min(d, ceiling)
}

// minRetry is the first backoff after a failure.
const minRetry = 50 * time.Millisecond

func (e *Elector) value() []byte {
	host, _ := os.Hostname()
	b, _ := json.Marshal(Holder{ID: e.cfg.ID, Host: host, PID: os.Getpid(), Renewed: e.now().UTC()})
	return b
}

// campaign returns the revision of a won Create. It returns an error only
// when ctx ends or on a permanent failure; every other failure, of the
// watch or of a Create, is retried with retryDelay's backoff.
func (e *Elector) campaign(ctx context.Context) (uint64, error) {
	var w jetstream.KeyWatcher
	var updates <-chan jetstream.KeyValueEntry
	stop := func() {
		if w != nil {
			_ = w.Stop()
			w, updates = nil, nil
		}
	}
	defer stop()
	retry := time.NewTimer(0)
	defer retry.Stop()
	failures := 0
	logged := false
	for {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-retry.C:
			if w != nil {
				break
			}
			// Watch before each timed Create until a watch stands, so a
			// delete after a failed Create wakes us. Creating the watch
			// waits for the server (up to the JetStream timeout, 5 s,
			// when it is down); on a failure the timer campaigns and the
			// watch is tried again at its next wake.
			nw, err := e.kv.Watch(ctx, e.cfg.Key, jetstream.UpdatesOnly())
			switch {
			case err == nil:
				w, updates = nw, nw.Updates()
			case ctx.Err() != nil:
				return 0, ctx.Err()
			case permanent(err):
				return 0, fmt.Errorf("watch lease %s: %w", e.cfg.Key, err)
			default:
				e.log.Warn().Err(err).Msg("lease watch failed; retrying")
			}
		case u, ok := <-updates:
			if !ok {
				// The watch ended (its connection closed, or its
				// consumer could not be recreated): a closed channel is
				// always ready and the loop spun a core. The timer, always
				// armed here, campaigns and watches anew.
				stop()
				continue
			}
			if u == nil || u.Operation() == jetstream.KeyValuePut {
				continue
			}
			// Deleted or expired: campaign now.
		}
		start := e.now()
		rev, err := e.kv.Create(ctx, e.cfg.Key, e.value())
		switch {
		case err == nil:
			e.mu.Lock()
			e.epoch, e.validTo = rev, start.Add(e.cfg.TTL)
			e.mu.Unlock()
			return rev, nil
		case ctx.Err() != nil:
			return 0, ctx.Err()
		case errors.Is(err, jetstream.ErrKeyExists):
			failures = 0
			if !logged {
				if cur, gerr := e.kv.Get(ctx, e.cfg.Key); gerr == nil {
					e.log.Info().RawJSON("leader", cur.Value()).Msg("standing by")
				}
				logged = true
			}
		case permanent(err):
			return 0, fmt.Errorf("create lease %s: %w", e.cfg.Key, err)
		default:
			failures++
			e.log.Warn().Err(err).Int("failures", failures).Msg("lease campaign failed; retrying")
		}
		retry.Stop()
		retry.Reset(retryDelay(e.cfg.TTL, failures))
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

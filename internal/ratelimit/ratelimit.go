package ratelimit

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// Limit is one named limit: Limit grants per Interval, at most Burst at once.
type Limit struct {
	// Limit is how many grants per Interval (at least 1).
	Limit int `yaml:"limit" json:"limit"`
	// Interval is the period Limit counts over. Defaults to 1s.
	Interval protocol.Duration `yaml:"interval,omitempty" json:"interval,omitempty"`
	// Burst is how many grants may come back to back after an idle spell;
	// it also lets callers that wake a little late catch up. Defaults to a
	// tenth of Limit (at least 1); 1 spreads grants evenly, Interval/Limit
	// apart.
	Burst int `yaml:"burst,omitempty" json:"burst,omitempty"`
}

// WithDefaults fills unset fields.
func (l Limit) WithDefaults() Limit {
	if l.Interval <= 0 {
		l.Interval = protocol.Duration(time.Second)
	}
	if l.Burst <= 0 {
		l.Burst = max(1, (l.Limit+9)/10)
	}
	return l
}

// MaxInterval is the longest interval a limit may have. A record (the
// theoretical arrival time) is at most an interval ahead of its write, so
// the bucket's TTL (streams/kv_ratelimits.json) must outlast it: with a 1 h
// TTL, a 24 h limit's record expired an hour after its grants were spent
// and read back as a full bucket, granting a whole burst again.
const MaxInterval = 24 * time.Hour

// Validate names the field and the rule that is broken.
func (l Limit) Validate(name string) error {
	if !protocol.ValidToken(name) {
		return fmt.Errorf("rate_limits: name %q may contain only letters, digits, '_' and '-'", name)
	}
	if l.Limit < 1 {
		return fmt.Errorf("rate_limits.%s.limit must be at least 1, got %d", name, l.Limit)
	}
	if l.Interval.Std() > MaxInterval {
		return fmt.Errorf("rate_limits.%s.interval must be at most %s, got %s", name, MaxInterval, l.Interval)
	}
	if l.Burst > l.Limit {
		return fmt.Errorf("rate_limits.%s.burst must be at most limit (%d), got %d", name, l.Limit, l.Burst)
	}
	return nil
}

// emission is the spacing of grants.
func (l Limit) emission() time.Duration { return l.Interval.Std() / time.Duration(l.Limit) }

// Config is the rate_limits: section of the scheduler's configuration:
// limits by name.
type Config map[string]Limit

// Validate checks every limit.
func (c Config) Validate() error {
	for name, l := range c {
		if err := l.WithDefaults().Validate(name); err != nil {
			return err
		}
	}
	return nil
}

// ErrUnknownLimit is returned for a name the configuration does not define.
var ErrUnknownLimit = errors.New("unknown rate limit")

// ErrConflict is returned when the limit stayed contended for every CAS
// attempt; it is transient.
var ErrConflict = errors.New("rate limit contended, try again")

// Limiter grants calls under the configured limits.
type Limiter struct {
	kv     jetstream.KeyValue
	limits Config
	now    func() time.Time

	mu    sync.Mutex
	cache map[string]cached // last known record per KV key
	// keys serialises this process's grants of each record: callers
	// woken at the same retry time would otherwise all try the same
	// compare-and-set, all but one lose and read again, a dozen round
	// trips per grant; serialised, the rest are refused from the cache.
	// Races with other processes are still settled by the CAS.
	keys sync.Map // KV key → *sync.Mutex
}

// lock takes k's mutex; the caller unlocks it.
func (l *Limiter) lock(k string) *sync.Mutex {
	mu, _ := l.keys.LoadOrStore(k, new(sync.Mutex))
	m := mu.(*sync.Mutex)
	m.Lock()
	return m
}

type cached struct {
	rev uint64
	tat time.Time
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithClock sets the clock (tests).
func WithClock(now func() time.Time) Option { return func(l *Limiter) { l.now = now } }

// New opens the warden_ratelimits bucket (streams.EnsureWorkflow creates it).
func New(ctx context.Context, js jetstream.JetStream, limits Config, opts ...Option) (*Limiter, error) {
	if err := limits.Validate(); err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, streams.BucketRateLimits)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", streams.BucketRateLimits, err)
	}
	l := &Limiter{kv: kv, limits: make(Config, len(limits)), now: time.Now, cache: map[string]cached{}}
	for name, lim := range limits {
		l.limits[name] = lim.WithDefaults()
	}
	for _, o := range opts {
		o(l)
	}
	return l, nil
}

// Known reports whether name is a configured limit (for validating specs).
func (l *Limiter) Known(name string) bool { _, ok := l.limits[name]; return ok }

// kvKey is the record of a limit and key.
func kvKey(name, key string) string {
	if key == "" {
		return name
	}
	return name + "." + key
}

// Allow takes one grant of limit name for key ("" for the limit as a
// whole). When it is refused, retryAt is the earliest time a grant can be
// had.
func (l *Limiter) Allow(ctx context.Context, name, key string) (granted bool, retryAt time.Time, err error) {
	lim, ok := l.limits[name]
	if !ok {
		return false, time.Time{}, fmt.Errorf("%w %q", ErrUnknownLimit, name)
	}
	if key != "" && !protocol.ValidToken(key) {
		return false, time.Time{}, fmt.Errorf("rate limit %s: invalid key %q", name, key)
	}
	k := kvKey(name, key)
	t := lim.emission()
	tau := time.Duration(lim.Burst-1) * t
	defer l.lock(k).Unlock()
	l.mu.Lock()
	c, have := l.cache[k]
	l.mu.Unlock()
	for attempt := range 16 {
		if err := casBackoff(ctx, attempt); err != nil {
			return false, time.Time{}, err
		}
		if !have {
			if c, err = l.read(ctx, k); err != nil {
				return false, time.Time{}, err
			}
		}
		now := l.now()
		tat := c.tat
		if tat.Before(now) {
			tat = now
		}
		if allowAt := tat.Add(-tau); allowAt.After(now) {
			// Refused on what we know; if what we know is stale, the
			// truth can only be later, so this refusal stands.
			return false, allowAt, nil
		}
		next := tat.Add(t)
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(next.UnixNano()))
		var rev uint64
		if c.rev == 0 {
			rev, err = l.kv.Create(ctx, k, b[:])
		} else {
			rev, err = l.kv.Update(ctx, k, b[:], c.rev)
		}
		if err == nil {
			l.remember(k, cached{rev: rev, tat: next})
			return true, time.Time{}, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !streams.LostCAS(err) {
			l.forget(k)
			return false, time.Time{}, fmt.Errorf("write rate limit %s: %w", k, err)
		}
		have = false // another scheduler granted meanwhile: re-read
	}
	l.forget(k)
	return false, time.Time{}, ErrConflict
}

// Return gives back one grant of limit name for key that was never used:
// the call it admitted did not happen (a scheduler's dispatch that did not
// land). The limit's timestamp moves back one emission interval, so the
// grant is offered again instead of lost; a limit that is idle by now is
// left alone (it is full, and giving back never lifts it past its burst).
// Returning a grant that was used would break the limit: callers return
// each grant at most once, and only when its call is known not to run.
func (l *Limiter) Return(ctx context.Context, name, key string) error {
	lim, ok := l.limits[name]
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownLimit, name)
	}
	k := kvKey(name, key)
	t := lim.emission()
	defer l.lock(k).Unlock()
	l.mu.Lock()
	c, have := l.cache[k]
	l.mu.Unlock()
	for attempt := range 16 {
		if err := casBackoff(ctx, attempt); err != nil {
			return err
		}
		if !have {
			var err error
			if c, err = l.read(ctx, k); err != nil {
				return err
			}
		}
		now := l.now()
		if c.rev == 0 || !c.tat.After(now) {
			return nil // idle: nothing to give back
		}
		prev := c.tat.Add(-t)
		if prev.Before(now) {
			prev = now
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(prev.UnixNano()))
		rev, err := l.kv.Update(ctx, k, b[:], c.rev)
		if err == nil {
			l.remember(k, cached{rev: rev, tat: prev})
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !streams.LostCAS(err) {
			l.forget(k)
			return fmt.Errorf("return grant of rate limit %s: %w", k, err)
		}
		have = false // granted or returned meanwhile: re-read
	}
	l.forget(k)
	return ErrConflict
}

func (l *Limiter) read(ctx context.Context, k string) (cached, error) {
	e, err := l.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return cached{}, nil
	}
	if err != nil {
		return cached{}, fmt.Errorf("read rate limit %s: %w", k, err)
	}
	c := cached{rev: e.Revision()}
	if v := e.Value(); len(v) == 8 {
		c.tat = time.Unix(0, int64(binary.BigEndian.Uint64(v)))
	}
	return c, nil
}

func (l *Limiter) remember(k string, c cached) {
	l.mu.Lock()
	l.cache[k] = c
	l.mu.Unlock()
}

func (l *Limiter) forget(k string) {
	l.mu.Lock()
	delete(l.cache, k)
	l.mu.Unlock()
}

// casBackoff waits before attempt (none before the first): a random delay
// that grows with the attempts, so that writers that lost a
// compare-and-set to each other spread out instead of colliding again.
func casBackoff(ctx context.Context, attempt int) error {
	if attempt == 0 {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Duration(rand.Int64N(int64(attempt) * int64(time.Millisecond)))):
		return nil
	}
}

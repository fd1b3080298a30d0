package ratelimit_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ratelimit"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

func setup(t *testing.T, n int, cfg ratelimit.Config, opts ...ratelimit.Option) []*ratelimit.Limiter {
	t.Helper()
	srv := natstest.New(t)
	ctx := context.Background()
	var out []*ratelimit.Limiter
	for i := range n {
		_, js := srv.Connect(t)
		if i == 0 {
			if err := streams.EnsureWorkflow(ctx, js, streams.Options{}); err != nil {
				t.Fatal(err)
			}
		}
		l, err := ratelimit.New(ctx, js, cfg, opts...)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

func TestBurstAndSpacing(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	cfg := ratelimit.Config{"api": {Limit: 10, Interval: protocol.Duration(time.Second), Burst: 3}}
	ls := setup(t, 2, cfg, ratelimit.WithClock(clock))
	ctx := context.Background()
	allow := func(i int, key string) (bool, time.Time) {
		ok, at, err := ls[i%2].Allow(ctx, "api", key)
		if err != nil {
			t.Fatal(err)
		}
		return ok, at
	}
	for i := range 3 {
		if ok, _ := allow(i, ""); !ok {
			t.Fatalf("grant %d of the burst of 3 refused", i+1)
		}
	}
	ok, at := allow(1, "")
	if ok {
		t.Fatal("a fourth grant at once with burst 3")
	}
	if want := now.Add(100 * time.Millisecond); !at.Equal(want) {
		t.Fatalf("retry at %v, want %v (one emission interval)", at, want)
	}
	advance(100 * time.Millisecond)
	if ok, _ := allow(0, ""); !ok {
		t.Fatal("refused at the retry time")
	}
	if ok, _ := allow(1, ""); ok {
		t.Fatal("granted twice in one emission interval")
	}
	// Keys are independent.
	if ok, _ := allow(0, "customer-42"); !ok {
		t.Fatal("another key refused")
	}
	if _, _, err := ls[0].Allow(ctx, "nope", ""); !errors.Is(err, ratelimit.ErrUnknownLimit) {
		t.Fatalf("unknown limit: %v", err)
	}
}

// TestReturnedGrantIsOfferedAgain: a grant given back (its call never ran)
// is available at once to the other scheduler; giving back on a limit that
// has gone idle never lifts it past its burst.
func TestReturnedGrantIsOfferedAgain(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	cfg := ratelimit.Config{"api": {Limit: 10, Interval: protocol.Duration(time.Second), Burst: 2}}
	ls := setup(t, 2, cfg, ratelimit.WithClock(clock))
	ctx := context.Background()
	allow := func(i int) bool {
		ok, _, err := ls[i].Allow(ctx, "api", "")
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for n := range 2 {
		if !allow(0) {
			t.Fatalf("grant %d of the burst of 2 refused", n+1)
		}
	}
	if allow(1) {
		t.Fatal("a third grant at once with burst 2")
	}
	if err := ls[0].Return(ctx, "api", ""); err != nil {
		t.Fatal(err)
	}
	if !allow(1) {
		t.Fatal("the returned grant was not offered again")
	}
	if allow(0) {
		t.Fatal("a grant beyond the one returned")
	}
	// Idle for a while: full again (burst 2); a return must not make it 3.
	advance(time.Second)
	if err := ls[1].Return(ctx, "api", ""); err != nil {
		t.Fatal(err)
	}
	if !allow(0) || !allow(1) {
		t.Fatal("the burst of 2 refused after an idle spell")
	}
	if allow(0) {
		t.Fatal("a return on an idle limit lifted it past its burst")
	}
	if err := ls[0].Return(ctx, "nope", ""); !errors.Is(err, ratelimit.ErrUnknownLimit) {
		t.Fatalf("unknown limit: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  ratelimit.Config
		want string
	}{
		{ratelimit.Config{"a": {Limit: 0}}, "rate_limits.a.limit must be at least 1"},
		{ratelimit.Config{"a.b": {Limit: 1}}, "may contain only"},
		{ratelimit.Config{"a": {Limit: 2, Burst: 3}}, "rate_limits.a.burst must be at most limit"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want %q", c.cfg, err, c.want)
		}
	}
}

// TestFiftyPerSecondAcrossTwoSchedulers: 8 callers on each of two
// schedulers ask as fast as the limiter lets them until 500 grants (10 s
// at 50/s) are had. The grants must never run ahead of the limit: at every
// grant, no more than burst + 50/s × the time since the start. The work
// must complete, within a generous deadline; how close to 50/s the
// limiter gets is logged, not asserted (speed is for benchmarks).
func TestFiftyPerSecondAcrossTwoSchedulers(t *testing.T) {
	if testing.Short() {
		t.Skip("10 s")
	}
	t.Parallel()
	const rate, want = 50, 500
	const burst = 5 // the default: a tenth of 50
	cfg := ratelimit.Config{"crm": {Limit: rate, Interval: protocol.Duration(time.Second)}}
	ls := setup(t, 2, cfg)
	var grants [2]atomic.Int64
	var mu sync.Mutex
	var times []time.Time // when each grant was seen, after Allow returned
	var total atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range 16 {
		l := ls[w%2]
		wg.Go(func() {
			for ctx.Err() == nil && total.Load() < want {
				ok, at, err := l.Allow(ctx, "crm", "")
				switch {
				case errors.Is(err, ratelimit.ErrConflict):
				case err != nil:
					if ctx.Err() == nil {
						t.Error(err)
					}
					return
				case ok:
					now := time.Now()
					grants[w%2].Add(1)
					total.Add(1)
					mu.Lock()
					times = append(times, now)
					mu.Unlock()
				default:
					select {
					case <-ctx.Done():
					case <-time.After(time.Until(at)):
					}
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	n := total.Load()
	t.Logf("%d grants in %s across two schedulers (%d + %d): %.1f/s, limit %d/s",
		n, elapsed.Round(time.Millisecond), grants[0].Load(), grants[1].Load(), float64(n)/elapsed.Seconds(), rate)
	if n < want {
		t.Fatalf("%d of %d grants within %s", n, want, elapsed.Round(time.Millisecond))
	}
	// A grant is recorded after Allow returned, so its time is no earlier
	// than the limiter's decision: the bound below errs on the lenient side.
	slices.SortFunc(times, func(x, y time.Time) int { return x.Compare(y) })
	for k, at := range times {
		if limit := burst + int64(rate*at.Sub(start).Seconds()); int64(k+1) > limit {
			t.Fatalf("%d grants by %s, more than burst + %d/s × that = %d", k+1, at.Sub(start).Round(time.Millisecond), rate, limit)
		}
	}
	if grants[0].Load() == 0 || grants[1].Load() == 0 {
		t.Fatal("one scheduler got no grants")
	}
}

// A record must outlive the longest interval: expired early, it reads back
// as a full bucket. The bucket's TTL was 1 h for intervals up to 24 h.
func TestRecordsOutliveTheLongestInterval(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	ctx := context.Background()
	if err := streams.EnsureWorkflow(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, streams.BucketRateLimits)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() <= ratelimit.MaxInterval {
		t.Fatalf("bucket TTL %s, want more than the longest interval %s", st.TTL(), ratelimit.MaxInterval)
	}
}

package lease

import (
	"testing"
	"time"
)

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	const ttl = 5 * time.Second
	for _, c := range []struct {
		ttl      time.Duration
		failures int
		want     time.Duration
	}{
		{ttl, 0, ttl / 4}, // held by another: the standby cadence
		{ttl, 1, 50 * time.Millisecond},
		{ttl, 2, 100 * time.Millisecond},
		{ttl, 5, 800 * time.Millisecond},
		{ttl, 6, ttl / 4}, // capped
		{ttl, 1000, ttl / 4},
		{100 * time.Millisecond, 0, 50 * time.Millisecond}, // never under the first backoff
		{100 * time.Millisecond, 3, 50 * time.Millisecond},
	} {
		if got := retryDelay(c.ttl, c.failures); got != c.want {
			t.Errorf("retryDelay(%s, %d) = %s, want %s", c.ttl, c.failures, got, c.want)
		}
	}
}

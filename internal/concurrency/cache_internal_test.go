package concurrency

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/streams"
)

// cachedKeys is how many keys l keeps state for.
func cachedKeys(l *Limiter) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}

// Per-entity keys taken here and released by another scheduler (any may
// dispatch; results go to the partition's owner) stayed cached here for
// good: a key's state was dropped only when this process wrote it idle.
// Once their leases are over they are swept when the map grows. (Found by
// a reviewer.)
//
// Old code: "limiter a keeps state for 1100 keys no one holds any more
// (of 1100)".
func TestKeysReleasedElsewhereAreSwept(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ls := limiters(t, 2)
	a, b := ls[0], ls[1]
	// Short leases: most are over by the time the map reaches minSweep.
	const n = minSweep + 76
	for i := range n {
		key := fmt.Sprintf("customer-%d", i)
		if ok, _, err := a.Acquire(ctx, key, 1, "j.s", time.Millisecond); err != nil || !ok {
			t.Fatalf("acquire %s: %v %v", key, ok, err)
		}
		if _, err := b.Release(ctx, key, "j.s"); err != nil {
			t.Fatal(err)
		}
	}
	if got := cachedKeys(a); got > n/4 {
		t.Fatalf("limiter a keeps state for %d keys no one holds any more (of %d)", got, n)
	}
}

// limiters returns n limiters of one deployment, as n schedulers' are.
func limiters(t *testing.T, n int) []*Limiter {
	t.Helper()
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	ctx := context.Background()
	if err := streams.EnsureWorkflow(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	out := make([]*Limiter, n)
	for i := range out {
		l, err := New(ctx, js, Config{})
		if err != nil {
			t.Fatal(err)
		}
		out[i] = l
	}
	return out
}

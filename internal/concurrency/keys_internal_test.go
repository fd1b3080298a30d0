package concurrency

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestIdleKeysAreForgotten: a process keeps state only for the keys it is
// using or caches; keys used once (per-entity keys) do not pile up in it.
func TestIdleKeysAreForgotten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := limiters(t, 1)[0]
	for i := range 100 {
		key := fmt.Sprintf("customer-%d", i)
		if ok, _, err := l.Acquire(ctx, key, 1, "j.s", time.Minute); err != nil || !ok {
			t.Fatalf("acquire %s: %v %v", key, ok, err)
		}
		if _, err := l.Release(ctx, key, "j.s"); err != nil {
			t.Fatal(err)
		}
	}
	if ok, _, err := l.Acquire(ctx, "busy", 1, "j.s", time.Minute); err != nil || !ok {
		t.Fatalf("acquire busy: %v %v", ok, err)
	}
	if n := cachedKeys(l); n != 1 {
		t.Fatalf("the limiter keeps state for %d keys, want 1 (the one held)", n)
	}
}

package concurrency

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/streams"
)

// TestIdleKeysAreForgotten: a process keeps state only for the keys it is
// using or caches; keys used once (per-entity keys) do not pile up in it.
func TestIdleKeysAreForgotten(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	ctx := context.Background()
	if err := streams.EnsureWorkflow(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	l, err := New(ctx, js, Config{})
	if err != nil {
		t.Fatal(err)
	}
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

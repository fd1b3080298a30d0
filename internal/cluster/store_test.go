package cluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// TestWaitHandled: WaitHandled returns when the request is deleted while it
// waits, at once when it was deleted before it looked, and with the
// context's error while nobody handles it.
func TestWaitHandled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.define(t, protocol.ClusterDefinition{Name: "wh", Mode: protocol.ModeActiveActive})
	ctx := context.Background()
	kv := b.store.Runtime()
	request := func() string {
		id, err := b.store.Request(ctx, "wh", protocol.ClusterRequest{Op: protocol.RequestRebalance})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}

	// Nobody handles it: the wait ends with the context.
	id := request()
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := b.store.WaitHandled(wctx, "wh", id)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("unhandled request: %v, want deadline exceeded", err)
	}

	// Handled while it waits (or, if the goroutine is slow to start,
	// just before: either way it returns nil).
	done := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		done <- b.store.WaitHandled(wctx, "wh", id)
	}()
	if err := kv.Delete(ctx, protocol.ClusterRequestKey("wh", id)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("request deleted while waiting: %v", err)
	}

	// Handled before it looked.
	id = request()
	if err := kv.Delete(ctx, protocol.ClusterRequestKey("wh", id)); err != nil {
		t.Fatal(err)
	}
	wctx, cancel = context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := b.store.WaitHandled(wctx, "wh", id); err != nil {
		t.Fatalf("request deleted before the wait: %v", err)
	}
}

// A handled request left a delete marker for good: every failover and
// rebalance ever asked stayed in warden_cluster_runtime (and in every
// member's watch). The leader's removal now carries a TTL.
func TestHandledRequestLeavesNoLastingMarker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.define(t, protocol.ClusterDefinition{Name: "hm", Mode: protocol.ModeActiveActive})
	b.start(t, "hm", "a")
	ctx := context.Background()
	id, err := b.store.Request(ctx, "hm", protocol.ClusterRequest{Op: protocol.RequestRebalance})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := b.store.WaitHandled(wctx, "hm", id); err != nil {
		t.Fatal(err)
	}
	s, err := b.js.Stream(ctx, "KV_"+protocol.BucketClusterRuntime)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, "$KV."+protocol.BucketClusterRuntime+"."+protocol.ClusterRequestKey("hm", id))
	if err != nil {
		t.Fatal(err)
	}
	if op, ttl := m.Header.Get("KV-Operation"), m.Header.Get("Nats-TTL"); op == "" || ttl == "" {
		t.Fatalf("the handled request's marker: KV-Operation %q, Nats-TTL %q; want a marker that expires", op, ttl)
	}
}

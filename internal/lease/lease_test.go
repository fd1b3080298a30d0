package lease_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/lease"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// TestStandbyTakesOverWhenLeaseExpires: a leader that dies without
// releasing keeps the lease until the bucket's TTL removes its key; the
// standby then takes it with a higher epoch. How fast is measured by the
// failover benchmark (internal/bench), not here: the test asserts the
// mechanism, the expiry marker followed by b's Create.
func TestStandbyTakesOverWhenLeaseExpires(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	srv, _, js := natstest.Start(t, streams.Options{LeaseTTL: ttl})

	type candidate struct {
		el     *lease.Elector
		epoch  atomic.Uint64
		cancel context.CancelFunc
		nc     interface{ Close() }
	}
	start := func(id string) *candidate {
		nc, js := srv.Connect(t)
		kv, err := js.KeyValue(context.Background(), protocol.BucketLeases)
		if err != nil {
			t.Fatal(err)
		}
		el, err := lease.New(kv, lease.Config{Key: "supervisor", ID: id, TTL: ttl}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		c := &candidate{el: el, cancel: cancel, nc: nc}
		go func() {
			_ = el.Run(ctx, func(ctx context.Context, epoch uint64) {
				c.epoch.Store(epoch)
				<-ctx.Done()
				c.epoch.Store(0)
			})
		}()
		t.Cleanup(cancel)
		return c
	}
	a := start("a")
	natstest.Eventually(t, 5*time.Second, "a elected", func() bool { return a.epoch.Load() != 0 })
	b := start("b")
	// b must not lead while a renews: wait across two renewals.
	deadline := time.Now().Add(2 * ttl)
	for time.Now().Before(deadline) {
		if b.epoch.Load() != 0 {
			t.Fatal("b elected while a holds the lease")
		}
		time.Sleep(50 * time.Millisecond)
	}
	first := a.epoch.Load()

	// Watch the key from here on: every change to it, in order.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kv, err := js.KeyValue(ctx, protocol.BucketLeases)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, "supervisor", jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()

	// a dies without releasing: its connection is gone.
	a.nc.Close()
	natstest.Eventually(t, ttl+time.Minute, "b takes over", func() bool { return b.epoch.Load() != 0 })
	if b.epoch.Load() <= first {
		t.Errorf("new epoch %d not above old %d", b.epoch.Load(), first)
	}
	if _, ok := a.el.Leader(); ok {
		t.Error("a still believes it leads after its lease ran out")
	}

	// The key's history since a died: a's renewals (if one fell in), then
	// the server's expiry marker, then b's Create at b's epoch. A release
	// (a plain delete) or b overwriting a live key would show otherwise.
	expired := false
	for {
		var u jetstream.KeyValueEntry
		select {
		case u = <-w.Updates():
		case <-ctx.Done():
			t.Fatal("b's Create never showed on the watch")
		}
		if u == nil {
			continue
		}
		if u.Operation() != jetstream.KeyValuePut {
			// The server's MaxAge marker reads as a purge; the elector's
			// release is a delete, and it never purges.
			if u.Operation() != jetstream.KeyValuePurge {
				t.Fatalf("a's key removed by %s at revision %d, want its expiry (a MaxAge marker, a purge)", u.Operation(), u.Revision())
			}
			expired = true
			continue
		}
		var h lease.Holder
		if err := json.Unmarshal(u.Value(), &h); err != nil {
			t.Fatal(err)
		}
		if h.ID == "a" {
			if expired {
				t.Fatal("a renewed after its key expired")
			}
			continue
		}
		if h.ID != "b" || u.Revision() != b.epoch.Load() {
			t.Fatalf("key taken by %q at revision %d, want b at its epoch %d", h.ID, u.Revision(), b.epoch.Load())
		}
		if !expired {
			t.Fatal("b created the key before a's expired")
		}
		break
	}
}

func TestReleaseOnStopHandsOverAtOnce(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.Start(t, streams.Options{LeaseTTL: 30 * time.Second})
	kv, err := js.KeyValue(context.Background(), protocol.BucketLeases)
	if err != nil {
		t.Fatal(err)
	}
	run := func(id string, ctx context.Context, led *atomic.Bool) {
		el, err := lease.New(kv, lease.Config{Key: "x", ID: id, TTL: 30 * time.Second}, zerolog.Nop())
		if err != nil {
			t.Error(err)
			return
		}
		_ = el.Run(ctx, func(ctx context.Context, _ uint64) { led.Store(true); <-ctx.Done() })
	}
	var aLed, bLed atomic.Bool
	actx, acancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { run("a", actx, &aLed); close(done) }()
	natstest.Eventually(t, 5*time.Second, "a elected", aLed.Load)
	bctx, bcancel := context.WithCancel(context.Background())
	defer bcancel()
	go run("b", bctx, &bLed)
	acancel()
	<-done
	// With a 30 s TTL, only the release can make b leader this fast.
	natstest.Eventually(t, 5*time.Second, "b elected after release", bLed.Load)
}

package lease_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/lease"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

func TestStandbyTakesOverWithinTTL(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	srv, _, _ := natstest.Start(t, streams.Options{LeaseTTL: ttl})

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

	// a dies without releasing: its connection is gone.
	a.nc.Close()
	died := time.Now()
	natstest.Eventually(t, ttl+3*time.Second, "b takes over", func() bool { return b.epoch.Load() != 0 })
	took := time.Since(died)
	t.Logf("takeover after %s (ttl %s)", took, ttl)
	if took > ttl+time.Second {
		t.Errorf("takeover took %s, more than ttl + 1s", took)
	}
	if b.epoch.Load() <= first {
		t.Errorf("new epoch %d not above old %d", b.epoch.Load(), first)
	}
	if _, ok := a.el.Leader(); ok {
		t.Error("a still believes it leads after its lease ran out")
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

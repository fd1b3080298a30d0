package lease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/lease"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// runner is one candidate running Run in a goroutine: epoch is the epoch
// its lead function holds (0: not leading), done receives what Run
// returned.
type runner struct {
	el     *lease.Elector
	epoch  atomic.Uint64
	done   chan error
	cancel context.CancelFunc
}

func startRunner(t *testing.T, nc *nats.Conn, key, id string, ttl time.Duration) *runner {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), protocol.BucketLeases)
	if err != nil {
		t.Fatal(err)
	}
	el, err := lease.New(kv, lease.Config{Key: key, ID: id, TTL: ttl}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{el: el, done: make(chan error, 1), cancel: cancel}
	go func() {
		r.done <- el.Run(ctx, func(ctx context.Context, epoch uint64) {
			r.epoch.Store(epoch)
			<-ctx.Done()
			r.epoch.Store(0)
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return 10 s after its context ended")
		}
	})
	return r
}

// returned reports whether Run has returned, and what.
func (r *runner) returned() (error, bool) {
	select {
	case err := <-r.done:
		r.done <- err // keep it for the next look and for Cleanup
		return err, true
	default:
		return nil, false
	}
}

// A leader whose server went away for longer than its renewal timeout plus
// the client's request timeout (5 s) stepped down, then failed to create
// the watch of its next campaign, and Run returned that error: the leading
// supervisor exited after an outage of about 8 s, while the standbys
// (whose watch existed) survived. Run now campaigns again, with a backoff,
// until its context ends, and leads again once the server is back.
func TestLeaderSurvivesServerOutage(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	srv := natstest.New(t)
	_, js := srv.ConnectReconnecting(t, 100*time.Millisecond)
	srv.Ensure(t, js, streams.Options{LeaseTTL: ttl})
	nc, _ := srv.ConnectReconnecting(t, 100*time.Millisecond)
	r := startRunner(t, nc, "outage", "a", ttl)
	natstest.Eventually(t, 5*time.Second, "a elected", func() bool { return r.epoch.Load() != 0 })
	first := r.epoch.Load()

	srv.Down()
	down := time.Now()
	// The leader's next renewal times out and it steps down ...
	natstest.Eventually(t, 2*ttl, "a steps down while the server is down", func() bool { return r.epoch.Load() == 0 })
	// ... and campaigns while the server stays down for 9 s: past the
	// first campaign's watch, which waits 5 s for the server.
	natstest.Eventually(t, 15*time.Second, "9 s of outage", func() bool {
		if err, ok := r.returned(); ok {
			t.Fatalf("Run returned %v %s into the outage", err, time.Since(down).Round(time.Millisecond))
		}
		return time.Since(down) >= 9*time.Second
	})
	srv.Up(t)
	up := time.Now()

	natstest.Eventually(t, 10*time.Second, "a leads again after the server is back", func() bool {
		if err, ok := r.returned(); ok {
			t.Fatalf("Run returned %v %s after the server came back", err, time.Since(up).Round(time.Millisecond))
		}
		return r.epoch.Load() != 0
	})
	t.Logf("leading again %s after the server came back", time.Since(up).Round(time.Millisecond))
	if e := r.epoch.Load(); e <= first {
		t.Errorf("new epoch %d not above old %d", e, first)
	}
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err
		if err != nil {
			t.Errorf("Run returned %v when its context ended, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return 5 s after its context ended")
	}
}

// A closed connection never comes back: Run returns an error saying so
// rather than campaigning on it forever.
func TestRunReturnsWhenConnectionClosed(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{LeaseTTL: ttl})
	nc, _ := srv.Connect(t)
	r := startRunner(t, nc, "closed", "a", ttl)
	natstest.Eventually(t, 5*time.Second, "a elected", func() bool { return r.epoch.Load() != 0 })
	nc.Close()
	var err error
	natstest.Eventually(t, 2*ttl, "Run returns", func() bool {
		var ok bool
		err, ok = r.returned()
		return ok
	})
	if !errors.Is(err, nats.ErrConnectionClosed) {
		t.Errorf("Run returned %v, want %v", err, nats.ErrConnectionClosed)
	}
}

func TestNewRejectsInvalidKey(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"", "a b", "a.*", "a.>", ".a", "a.", "a..b"} {
		if _, err := lease.New(nil, lease.Config{Key: key, ID: "x", TTL: time.Second}, zerolog.Nop()); err == nil {
			t.Errorf("New accepted key %q", key)
		}
	}
	for _, key := range []string{"supervisor", "cluster.c1", "a-b_c/d=e"} {
		if _, err := lease.New(nil, lease.Config{Key: key, ID: "x", TTL: time.Second}, zerolog.Nop()); err != nil {
			t.Errorf("New rejected key %q: %v", key, err)
		}
	}
}

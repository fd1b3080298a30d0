package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// leaseBucket starts a server with Warden's buckets (warden_cluster_leases with its
// default 5 s max age) and returns the leases bucket.
func leaseBucket(t *testing.T) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	_, _, js := natstest.Start(t, streams.Options{})
	kv, err := js.KeyValue(context.Background(), protocol.BucketClusterLeases)
	if err != nil {
		t.Fatal(err)
	}
	return js, kv
}

// newTestLease is a member's lease on cluster.lt, as NewMember binds it.
func newTestLease(t *testing.T, js jetstream.JetStream, kv jetstream.KeyValue, who string, d time.Duration) *lease {
	t.Helper()
	st, err := kv.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	l := &lease{js: js, kv: kv, key: protocol.ClusterLeaseKey("lt"), who: who, now: time.Now, bucketTTL: st.TTL()}
	l.setTTL(d)
	return l
}

// waitKeyGone polls the key until the server has removed it and returns
// when it saw it gone.
func waitKeyGone(t *testing.T, kv jetstream.KeyValue, key string, timeout time.Duration) time.Time {
	t.Helper()
	var gone time.Time
	natstest.Eventually(t, timeout, "the server removes "+key, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := kv.Get(ctx, key)
		gone = time.Now()
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
	return gone
}

// The server keeps a key's TTL in whole seconds: a lease written with
// lease_duration 1500ms is gone after 1 s. The holder counted on 1.5 s, so
// a leader paused past the second came back believing it led while a
// standby had taken the lease: two leaders. The holder now counts on what
// the server keeps, so by the time the key is gone it no longer holds it,
// and the next lessee is the only one.
func TestLeaseEndsWhenTheServerDropsTheKey(t *testing.T) {
	t.Parallel()
	js, kv := leaseBucket(t)
	ctx := context.Background()
	a := newTestLease(t, js, kv, "p.a", 1500*time.Millisecond)
	b := newTestLease(t, js, kv, "p.b", 1500*time.Millisecond)
	start := time.Now()
	if won, err := a.acquire(ctx); !won || err != nil {
		t.Fatalf("acquire: won=%v err=%v", won, err)
	}
	if _, ok := a.held(); !ok {
		t.Fatal("the lease is not held right after it was acquired")
	}
	// Not renewed: a paused leader.
	gone := waitKeyGone(t, kv, a.key, 10*time.Second)
	_, stillHeld := a.held()
	t.Logf("the key was gone %s after the write", gone.Sub(start))
	if stillHeld {
		t.Fatalf("the key was gone %s after the write (lease_duration 1500ms), yet its holder still counts itself leader",
			gone.Sub(start).Round(time.Millisecond))
	}
	if won, err := b.acquire(ctx); !won || err != nil {
		t.Fatalf("the next lessee could not acquire the expired lease: won=%v err=%v", won, err)
	}
	_, aHolds := a.held()
	_, bHolds := b.held()
	if aHolds || !bHolds {
		t.Fatalf("after the handover: old holder holds=%v, new holder holds=%v", aHolds, bHolds)
	}
	if err := a.renew(ctx); err == nil {
		t.Fatal("the deposed holder renewed the lease the new lessee holds")
	}
}

// The leases bucket's max age (the supervisor's lease_ttl) lowered while a
// leader runs: the server removes the lease key that old whatever its TTL.
// Read once at start-up, the old cap left the leader renewing with a
// longer TTL and counting on it, so it outlived its key. The renewal loop
// reads the cap again: the hold is cut to it and the TTL follows.
func TestLeaseFollowsALoweredBucketMaxAge(t *testing.T) {
	t.Parallel()
	js, kv := leaseBucket(t)
	ctx := context.Background()
	l := newTestLease(t, js, kv, "p.a", 3*time.Second)
	if won, err := l.acquire(ctx); !won || err != nil {
		t.Fatalf("acquire: won=%v err=%v", won, err)
	}
	m := &Member{lease: l, log: zerolog.Nop()}
	rctx, cancel := context.WithCancel(ctx)
	lost := make(chan error, 1)
	done := make(chan struct{})
	go func() { defer close(done); m.renewLoop(rctx, lost) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)

	s, err := js.Stream(ctx, "KV_"+protocol.BucketClusterLeases)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxAge = 2 * time.Second
	cfg.Duplicates = min(cfg.Duplicates, cfg.MaxAge) // the server's rule
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	rev := func() uint64 { l.mu.Lock(); defer l.mu.Unlock(); return l.rev }
	rev0 := rev()
	// Two renewals after the change: the first one's recap has read the
	// new cap, the second is written under it.
	natstest.Eventually(t, 10*time.Second, "two renewals after the max age was lowered", func() bool {
		select {
		case err := <-lost:
			t.Fatalf("renewal failed: %v", err)
		default:
		}
		return rev() >= rev0+2
	})
	// Then the leader pauses.
	stop()
	if _, ok := l.held(); !ok {
		t.Fatal("the lease was lost when the renewals stopped")
	}
	e, err := kv.Get(ctx, l.key)
	if err != nil {
		t.Fatal(err)
	}
	written := e.Created()
	gone := waitKeyGone(t, kv, l.key, 10*time.Second)
	_, stillHeld := l.held()
	t.Logf("the key was gone %s after the last renewal", gone.Sub(written))
	if stillHeld {
		t.Fatalf("the key was gone %s after the last renewal (lease_duration 3s, bucket max age lowered 5s -> 2s), yet its holder still counts itself leader",
			gone.Sub(written).Round(time.Millisecond))
	}
}

// A lease_duration that is not whole seconds is refused, naming the field,
// the rule and what the server would keep.
func TestLeaseDurationMustBeWholeSeconds(t *testing.T) {
	t.Parallel()
	const rule = "leader_election.lease_duration must be a whole number of seconds"
	for _, c := range []struct {
		lease, wantErr string
	}{
		{"2s", ""},
		{"1m", ""},
		{"1500ms", rule + " (the server keeps a key's TTL in whole seconds: 1.5s would last 1s), got 1.5s"},
		{"2.9s", rule},
		{"500ms", "leader_election.lease_duration must be at least 1s, got 500ms"},
	} {
		_, err := Parse([]byte("name: x\nreplication_mode: active_passive\nleader_election: {lease_duration: " + c.lease + "}\n"))
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("lease_duration %s refused: %v", c.lease, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("lease_duration %s: error %v, want one saying %q", c.lease, err, c.wantErr)
		case c.lease == "500ms" && strings.Contains(err.Error(), rule):
			t.Errorf("lease_duration 500ms: error %v names two rules for one value", err)
		}
	}
}

package streams_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// The first process records task_shards and partitions; a process
// configured differently is refused with both values named, and changes
// nothing.
func TestEnsureRefusesADeploymentMismatch(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, js, streams.Options{TaskShards: 4, Partitions: 8}); err != nil {
		t.Fatal(err)
	}
	// The same settings (a second scheduler, a restart) start.
	if err := streams.Ensure(ctx, js, streams.Options{TaskShards: 4, Partitions: 8}); err != nil {
		t.Fatalf("same settings refused: %v", err)
	}
	for _, c := range []struct {
		opts    streams.Options
		setting string
		mine    int
		theirs  int
	}{
		{streams.Options{TaskShards: 2, Partitions: 8}, "task_shards", 2, 4},
		{streams.Options{TaskShards: 4, Partitions: 16}, "partitions", 16, 8},
	} {
		err := streams.Ensure(ctx, js, c.opts)
		var mm *streams.MismatchError
		if !errors.As(err, &mm) || mm.Setting != c.setting || mm.Configured != c.mine || mm.Recorded != c.theirs {
			t.Fatalf("%+v: want a %s mismatch %d vs %d, got %v", c.opts, c.setting, c.mine, c.theirs, err)
		}
		msg := err.Error()
		for _, want := range []string{c.setting + "=" + strconv.Itoa(c.mine), c.setting + "=" + strconv.Itoa(c.theirs), "nats kv del " + protocol.BucketDeployment} {
			if !strings.Contains(msg, want) {
				t.Fatalf("message %q does not name %q", msg, want)
			}
		}
	}
	// Refused means untouched: still 4 task streams.
	if _, err := js.Stream(ctx, protocol.TaskStream(3)); err != nil {
		t.Fatalf("task shard 3 gone after a refused Ensure: %v", err)
	}
}

// An agent only reads the record: no record, no objection; a record that
// differs, a mismatch; a setting it does not know (0), no objection.
func TestVerifyDeployment(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := streams.VerifyDeployment(ctx, js, protocol.Deployment{TaskShards: 3}); err != nil {
		t.Fatalf("no record yet: %v", err)
	}
	if err := streams.CheckDeployment(ctx, js, protocol.Deployment{TaskShards: 4}, 1); err != nil {
		t.Fatal(err)
	}
	var mm *streams.MismatchError
	if err := streams.VerifyDeployment(ctx, js, protocol.Deployment{TaskShards: 3}); !errors.As(err, &mm) {
		t.Fatalf("want a mismatch, got %v", err)
	}
	if err := streams.VerifyDeployment(ctx, js, protocol.Deployment{TaskShards: 4, Partitions: 32}); err != nil {
		t.Fatalf("partitions not recorded yet must not be refused: %v", err)
	}
	// A later writer adds what the record lacks, keeping what it has.
	if err := streams.CheckDeployment(ctx, js, protocol.Deployment{Partitions: 32}, 1); err != nil {
		t.Fatal(err)
	}
	if err := streams.VerifyDeployment(ctx, js, protocol.Deployment{TaskShards: 4, Partitions: 16}); !errors.As(err, &mm) || mm.Setting != "partitions" {
		t.Fatalf("want a partitions mismatch after the record was extended, got %v", err)
	}
}

// The presence and leases buckets, whose TTL their owner sets, were skipped
// whenever they existed and this process did not set the TTL (`warden
// setup` does not): a later definition (replicas raised, say) never reached
// them. Ensure now applies the definition and keeps the bucket's TTL.
func TestEnsureUpdatesTheTTLBucketsKeepingTheirTTL(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, js, streams.Options{PresenceTTL: 7 * time.Second, LeaseTTL: 9 * time.Second}); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{protocol.BucketPresence, protocol.BucketLeases, protocol.BucketClusterLeases} {
		st, err := js.Stream(ctx, "KV_"+b)
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		cfg.Description, cfg.Metadata[streams.MetadataConfigHash] = "an older definition", "older"
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	for b, ttl := range map[string]time.Duration{protocol.BucketPresence: 7 * time.Second, protocol.BucketLeases: 9 * time.Second,
		protocol.BucketClusterLeases: 9 * time.Second} {
		st, err := js.Stream(ctx, "KV_"+b)
		if err != nil {
			t.Fatal(err)
		}
		if c := st.CachedInfo().Config; c.Description == "an older definition" || c.MaxAge != ttl {
			t.Errorf("%s after Ensure: description %q, TTL %s; want the definition's, TTL %s kept", b, c.Description, c.MaxAge, ttl)
		}
	}
}

package streams_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// errCodeRollupFailed is the server's JSStreamRollupFailedF ("rollup not
// permitted" on a stream that refuses roll-ups).
const errCodeRollupFailed = 10111

// rollupRefused reports whether err is the server refusing a roll-up.
func rollupRefused(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeRollupFailed
}

// rollupBuckets are the buckets whose streams accept roll-ups: each keeps
// limit markers, which the server stores as roll-ups and for which it keeps
// them on whatever the definition says (docs/security.md, "Roll-ups").
var rollupBuckets = []string{
	protocol.BucketJobs, protocol.BucketPresence, protocol.BucketLeases, protocol.BucketClusterLeases, protocol.BucketHealth,
	protocol.BucketClusters, protocol.BucketClusterRuntime, streams.BucketConcurrency,
}

// The deployment and rate-limit buckets refuse roll-ups once Ensure and
// EnsureWorkflow applied them: "Nats-Rollup: all" from a writer of one key
// purges nothing. The KV operations Warden uses on them still work. Only
// the buckets with limit markers accept roll-ups.
func TestBucketsWithoutMarkersRefuseRollups(t *testing.T) {
	_, _, js := natstest.Start(t, streams.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := streams.EnsureWorkflow(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	var allowing []string
	for _, bucket := range []string{protocol.BucketJobs, protocol.BucketPresence, protocol.BucketLeases, protocol.BucketClusterLeases, protocol.BucketHealth,
		protocol.BucketClusters, protocol.BucketClusterRuntime, protocol.BucketDeployment, streams.BucketConcurrency, streams.BucketRateLimits} {
		s, err := js.Stream(ctx, "KV_"+bucket)
		if err != nil {
			t.Fatal(err)
		}
		if s.CachedInfo().Config.AllowRollup {
			allowing = append(allowing, bucket)
		}
	}
	slices.Sort(allowing)
	want := slices.Sorted(slices.Values(rollupBuckets))
	if !slices.Equal(allowing, want) {
		t.Fatalf("buckets accepting roll-ups: %v, want only %v", allowing, want)
	}

	for _, bucket := range []string{protocol.BucketDeployment, streams.BucketRateLimits} {
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		// What Warden does with them: create, compare-and-set, delete.
		if _, err := kv.Put(ctx, "other", []byte("kept")); err != nil {
			t.Fatalf("%s: put: %v", bucket, err)
		}
		rev, err := kv.Create(ctx, "k", []byte("1"))
		if err != nil {
			t.Fatalf("%s: create: %v", bucket, err)
		}
		if rev, err = kv.Update(ctx, "k", []byte("2"), rev); err != nil {
			t.Fatalf("%s: update: %v", bucket, err)
		}
		if err := kv.Delete(ctx, "k", jetstream.LastRevision(rev)); err != nil {
			t.Fatalf("%s: delete: %v", bucket, err)
		}
		if _, err := kv.Create(ctx, "k", []byte("3")); err != nil {
			t.Fatalf("%s: create after a delete: %v", bucket, err)
		}
		for _, rollup := range []string{"all", "sub"} {
			m := nats.NewMsg("$KV." + bucket + ".k")
			m.Data = []byte("rollup")
			m.Header.Set(jetstream.MsgRollup, rollup)
			if _, err := js.PublishMsg(ctx, m); !rollupRefused(err) {
				t.Fatalf("%s: a write with Nats-Rollup: %s: %v, want the server's refusal", bucket, rollup, err)
			}
		}
		if err := kv.Purge(ctx, "k"); !rollupRefused(err) {
			t.Fatalf("%s: KeyValue.Purge (a roll-up): %v, want the server's refusal", bucket, err)
		}
		for key, want := range map[string]string{"other": "kept", "k": "3"} {
			if e, err := kv.Get(ctx, key); err != nil || string(e.Value()) != want {
				t.Fatalf("%s: %s after the refused roll-ups: %v %v, want %q", bucket, key, e, err, want)
			}
		}
	}
}

// The server keeps roll-ups on for a bucket with limit markers: asked to
// turn them off, it answers with them on. This is why the buckets with
// markers (presence, leases, health, clusters, jobs, concurrency) cannot
// refuse them, and why a definition asking for it is refused; if a server
// upgrade makes this fail, they can.
func TestServerKeepsRollupsOnBucketsWithMarkers(t *testing.T) {
	_, _, js := natstest.Start(t, streams.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "KV_"+protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	c := s.CachedInfo().Config
	if c.SubjectDeleteMarkerTTL == 0 {
		t.Fatal("the presence bucket has no limit markers")
	}
	c.AllowRollup = false
	s, err = js.UpdateStream(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if !s.CachedInfo().Config.AllowRollup {
		t.Fatal("the server turned roll-ups off on a bucket with limit markers: the marker buckets may refuse them now (streams/rollups.go, docs/security.md)")
	}
}

// Processes setting up together (two schedulers starting at once) both
// have nats.go create or update a bucket with roll-ups on before turning
// them off: one's update could land between the other's read and update,
// which then saw roll-ups on and took it for limit markers, and the
// scheduler refused to start. Both start now, and the buckets refuse
// roll-ups.
func TestConcurrentSetupsRefuseRollups(t *testing.T) {
	t.Parallel()
	for round := range 8 {
		srv := natstest.New(t)
		var wg sync.WaitGroup
		errs := make([]error, 3)
		for i := range errs {
			_, js := srv.Connect(t)
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := context.Background()
				if errs[i] = streams.Ensure(ctx, js, streams.Options{}); errs[i] == nil {
					errs[i] = streams.EnsureWorkflow(ctx, js, streams.Options{})
				}
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: setup %d: %v", round, i, err)
			}
		}
		_, js := srv.Connect(t)
		for _, b := range []string{"warden_ratelimits", "warden_deployment"} {
			s, err := js.Stream(context.Background(), "KV_"+b)
			if err != nil {
				t.Fatal(err)
			}
			if s.CachedInfo().Config.AllowRollup {
				t.Fatalf("round %d: %s allows roll-ups after concurrent setups", round, b)
			}
		}
	}
}

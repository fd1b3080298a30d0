package streams

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/embedded"
)

// testJetStream starts an embedded server (natstest imports this package)
// and connects to it; both end with the test.
func testJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	srv, err := embedded.Start(embedded.Options{Port: -1, StoreDir: t.TempDir(), ServerName: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// Every bucket file states allow_rollup_hdrs, and none refuses roll-ups
// while it keeps limit markers (the server would turn them on again).
func TestBucketDefinitionsStateRollups(t *testing.T) {
	bs, err := buckets(Options{})
	if err != nil {
		t.Fatal(err)
	}
	ws, err := workflowBuckets(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(bs)+len(ws) != 10 {
		t.Fatalf("%d bucket definitions, want 10", len(bs)+len(ws))
	}
	yes, no := true, false
	for _, c := range []struct {
		def  bucketDef
		want error
	}{
		{bucketDef{}, nil}, // unstated: an error, checked below
		{bucketDef{AllowRollup: &yes, KeyValueConfig: jetstream.KeyValueConfig{LimitMarkerTTL: time.Minute}}, nil},
		{bucketDef{AllowRollup: &no}, nil},
		{bucketDef{AllowRollup: &no, KeyValueConfig: jetstream.KeyValueConfig{LimitMarkerTTL: time.Minute}}, errMarkersNeedRollups},
	} {
		err := c.def.validate()
		if c.def.AllowRollup == nil {
			if err == nil {
				t.Fatal("a definition that does not state allow_rollup_hdrs is accepted")
			}
			continue
		}
		if !errors.Is(err, c.want) {
			t.Fatalf("validate(allow %v, markers %v) = %v, want %v", *c.def.AllowRollup, c.def.LimitMarkerTTL, err, c.want)
		}
	}
}

// A bucket made before it refused roll-ups (by nats.go, with them on and
// the hash of its definition then) is brought to its definition by the next
// Ensure (`warden setup`); the Ensure after that changes nothing.
func TestEnsureTurnsRollupsOffOnAnExistingBucket(t *testing.T) {
	js := testJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ws, err := workflowBuckets(Options{})
	if err != nil {
		t.Fatal(err)
	}
	var rl bucketDef
	for _, b := range ws {
		if b.Bucket == BucketRateLimits {
			rl = b
		}
	}
	old := rl.KeyValueConfig
	old.Description = "as an earlier release made it"
	old.Metadata = withHash(nil, kvHash(old))
	if _, err := js.CreateKeyValue(ctx, old); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, BucketRateLimits)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "limit.key", []byte("tat")); err != nil {
		t.Fatal(err)
	}
	if err := EnsureWorkflow(ctx, js, Options{}); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "KV_"+BucketRateLimits)
	if err != nil {
		t.Fatal(err)
	}
	c := s.CachedInfo().Config
	if c.AllowRollup || c.Metadata[MetadataConfigHash] != bucketHash(rl) || c.Description != rl.Description {
		t.Fatalf("after Ensure: roll-ups %v, hash %q (want %q), description %q", c.AllowRollup, c.Metadata[MetadataConfigHash], bucketHash(rl), c.Description)
	}
	if e, err := kv.Get(ctx, "limit.key"); err != nil || string(e.Value()) != "tat" {
		t.Fatalf("a record after Ensure: %v %v", e, err)
	}
	if !upToDate(ctx, js, "KV_"+BucketRateLimits, bucketHash(rl)) {
		t.Fatal("the bucket is not up to date after Ensure: every process would try to update it")
	}
	if err := EnsureWorkflow(ctx, js, Options{}); err != nil {
		t.Fatal(err)
	}
	if s, err = js.Stream(ctx, "KV_"+BucketRateLimits); err != nil || s.CachedInfo().Config.AllowRollup {
		t.Fatalf("a second Ensure: %v %+v", err, s.CachedInfo().Config)
	}
}

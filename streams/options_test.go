package streams_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// A setting no scheduler could run with (partitions above 1024, task_shards
// without a bound, a negative count that quietly became the default) was
// applied and written into the deployment record, after which every
// process configured sanely was refused as a mismatch. Ensure refuses it,
// naming the setting, and writes nothing.
func TestEnsureRefusesSettingsOutOfBounds(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		opts    streams.Options
		setting string
	}{
		{streams.Options{Partitions: 5000}, "partitions"},
		{streams.Options{Partitions: -3}, "partitions"},
		{streams.Options{TaskShards: 129}, "task_shards"},
		{streams.Options{TaskShards: -1}, "task_shards"},
		{streams.Options{Replicas: -1}, "replicas"},
		{streams.Options{LeaseTTL: -time.Second}, "lease_ttl"},
	} {
		err := streams.Ensure(ctx, js, c.opts)
		if err == nil || !strings.Contains(err.Error(), c.setting) {
			t.Errorf("%+v: Ensure = %v, want an error naming %s", c.opts, err, c.setting)
		}
		if err := streams.EnsureWorkflow(ctx, js, c.opts); err == nil || !strings.Contains(err.Error(), c.setting) {
			t.Errorf("%+v: EnsureWorkflow = %v, want an error naming %s", c.opts, err, c.setting)
		}
	}
	if kv, err := js.KeyValue(ctx, protocol.BucketDeployment); err == nil {
		if e, err := kv.Get(ctx, protocol.KeyDeployment); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("a refused Ensure wrote the deployment record: %s, %v", e.Value(), err)
		}
	}
	// The defaults still apply, and are what the record says.
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := streams.CheckDeployment(ctx, js, protocol.Deployment{TaskShards: streams.DefaultTaskShards, Partitions: streams.DefaultPartitions}, 1); err != nil {
		t.Fatalf("the record after the defaults applied: %v", err)
	}
}

func TestOptionsValidateBounds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		opts streams.Options
		ok   bool
	}{
		{streams.Options{}, true}, // the defaults
		{streams.Options{Replicas: 5, TaskShards: streams.MaxTaskShards, Partitions: streams.MaxPartitions}, true},
		{streams.Options{Replicas: 1, TaskShards: 1, Partitions: 1}, true},
		{streams.Options{Replicas: 6}, false},
		{streams.Options{TaskShards: streams.MaxTaskShards + 1}, false},
		{streams.Options{Partitions: streams.MaxPartitions + 1}, false},
		{streams.Options{PresenceTTL: -time.Second}, false},
	} {
		err := c.opts.Validate()
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, streams.ErrInvalidOptions)) {
			t.Errorf("%+v: Validate() = %v", c.opts, err)
		}
	}
}

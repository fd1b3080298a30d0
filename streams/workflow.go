package streams

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// Names of the workflow objects (issue 13: schedules, concurrency keys,
// rate limits).
const (
	StreamSchedules   = "WARDEN_SCHEDULES"
	BucketConcurrency = "warden_concurrency"
	BucketRateLimits  = "warden_ratelimits"
)

// WorkflowStreamConfigs returns the schedules stream.
func WorkflowStreamConfigs(opts Options) ([]jetstream.StreamConfig, error) {
	opts = opts.withDefaults()
	var c jetstream.StreamConfig
	if err := decode("schedules.json", &c); err != nil {
		return nil, err
	}
	c.Replicas = opts.Replicas
	return []jetstream.StreamConfig{c}, nil
}

// WorkflowKeyValueConfigs returns the concurrency and rate-limit buckets,
// in nats.go's form (see KeyValueConfigs).
func WorkflowKeyValueConfigs(opts Options) ([]jetstream.KeyValueConfig, error) {
	bs, err := workflowBuckets(opts)
	return kvConfigs(bs), err
}

func workflowBuckets(opts Options) ([]bucketDef, error) {
	opts = opts.withDefaults()
	var out []bucketDef
	for _, f := range []string{"kv_concurrency.json", "kv_ratelimits.json"} {
		b, err := decodeBucket(f)
		if err != nil {
			return nil, err
		}
		b.Replicas = opts.Replicas
		out = append(out, b)
	}
	return out, nil
}

// EnsureWorkflow creates or updates the schedules stream and the
// concurrency and rate-limit buckets. Safe to call from every process.
func EnsureWorkflow(ctx context.Context, js jetstream.JetStream, opts Options) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	ss, err := WorkflowStreamConfigs(opts)
	if err != nil {
		return err
	}
	for _, c := range ss {
		if err := ensureStream(ctx, js, c); err != nil {
			return err
		}
	}
	kvs, err := workflowBuckets(opts)
	if err != nil {
		return err
	}
	for _, c := range kvs {
		if err := ensureKV(ctx, js, c); err != nil {
			return err
		}
	}
	return nil
}

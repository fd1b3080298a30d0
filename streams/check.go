package streams

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// MetadataConfigHash is the stream metadata key holding a hash of the
// definition Ensure last applied. Ensure changes nothing when it matches,
// so processes whose credential may not create or update streams (every
// production role but setup) start against streams `warden setup` made.
const MetadataConfigHash = "warden.config"

// hashOf returns a stable hash of a definition without its metadata.
func hashOf(v any) string {
	b, _ := json.Marshal(v)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

func withHash(md map[string]string, h string) map[string]string {
	out := make(map[string]string, len(md)+1)
	for k, v := range md {
		out[k] = v
	}
	out[MetadataConfigHash] = h
	return out
}

func streamHash(c jetstream.StreamConfig) string {
	c.Metadata = nil
	return hashOf(c)
}

func kvHash(c jetstream.KeyValueConfig) string {
	c.Metadata = nil
	return hashOf(c)
}

// upToDate reports whether stream name exists with the definition hash h.
func upToDate(ctx context.Context, js jetstream.JetStream, name, h string) bool {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return false
	}
	return s.CachedInfo().Config.Metadata[MetadataConfigHash] == h
}

// SetupError says a stream or bucket is missing or differs from its
// definition and this process could not change it: in production only the
// setup identity may (run `warden setup`).
type SetupError struct {
	Name string
	Err  error
}

func (e *SetupError) Error() string {
	return fmt.Sprintf("stream %s is missing or differs from streams/*.json and could not be created or updated "+
		"(in production only the setup credential may: run `warden setup` first, with the same replicas, "+
		"task_shards and TTLs as this process): %v", e.Name, e.Err)
}

func (e *SetupError) Unwrap() error { return e.Err }

func setupError(name string, err error) error {
	var inc *IncompatibleError
	if errors.As(err, &inc) || errors.Is(err, context.Canceled) {
		return err
	}
	return &SetupError{Name: name, Err: err}
}

// ensureKV creates or updates a bucket unless it matches its definition.
// A bucket that refuses roll-ups is made by nats.go without the
// definition hash, then refuseRollups turns them off and records it.
func ensureKV(ctx context.Context, js jetstream.JetStream, b bucketDef) error {
	h := bucketHash(b)
	for attempt := 0; ; attempt++ {
		err := ensureKVOnce(ctx, js, b, h)
		// nats.go creates a missing bucket with a config of its own; one
		// another process created a moment before and has already changed
		// (roll-ups turned off) is "in use" with another config: look
		// again, it is an update now.
		var apiErr *jetstream.APIError
		if attempt == 3 || !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamNameInUse {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(20+rand.IntN(50)) * time.Millisecond):
		}
	}
}

func ensureKVOnce(ctx context.Context, js jetstream.JetStream, b bucketDef, h string) error {
	if upToDate(ctx, js, "KV_"+b.Bucket, h) {
		return nil
	}
	c := b.KeyValueConfig
	if !b.refusesRollups() {
		c.Metadata = withHash(c.Metadata, h)
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, c); err != nil {
		if isAPIError(err) {
			return &IncompatibleError{Name: "KV_" + c.Bucket, Err: err}
		}
		return setupError("KV_"+c.Bucket, fmt.Errorf("ensure bucket %s: %w", c.Bucket, err))
	}
	if b.refusesRollups() {
		return refuseRollups(ctx, js, b, h)
	}
	return nil
}

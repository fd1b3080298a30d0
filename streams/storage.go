package streams

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrConsumerInUse: a consumer with another storage type must be replaced,
// but a client consumes it now.
var ErrConsumerInUse = errors.New("consumer in use")

// ReplaceStorage makes way for creating the durable consumer cfg defines
// on stream when one by that name exists with another storage type, which
// the server never changes (a consumer an earlier release kept on disk):
// it deletes that one, unless inUse (nil: never) says a client consumes it
// (ErrConsumerInUse). It reports whether it deleted one; absent or already
// of cfg's storage type, there is nothing to delete. The messages stay in
// the work-queue stream and the new consumer delivers them.
func ReplaceStorage(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig,
	inUse func(*jetstream.ConsumerInfo) bool) (replaced bool, err error) {
	c, err := js.Consumer(ctx, stream, cfg.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	info := c.CachedInfo()
	if info.Config.MemoryStorage == cfg.MemoryStorage {
		return false, nil
	}
	if inUse != nil && inUse(info) {
		return false, ErrConsumerInUse
	}
	if err := js.DeleteConsumer(ctx, stream, cfg.Durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false, err
	}
	return true, nil
}

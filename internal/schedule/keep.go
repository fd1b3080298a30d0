package schedule

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/keep"
)

// relayPullExpiry is the expiry of the relays' pull requests. The server
// heartbeats a waiting pull every half of it, and a consume that misses
// two heartbeats says so (jetstream.ErrNoHeartbeat), which makes the
// keeper ask whether the consumer still exists. A consumer lost without a
// word (its deletion raced with a pull, or a server forgot it) is thus
// noticed within this time rather than the 30 s of the default expiry. An
// idle relay pulls once per expiry.
const relayPullExpiry = 3 * time.Second

// keptRelayConsumer is a relay's durable consumer, created again if the
// server loses it (package keep): nats.go ends a Consume for good when
// the server says the consumer was deleted, and the relay would relay
// nothing until its process restarted while delayed submissions and ticks
// piled up.
func keptRelayConsumer(js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig, handle jetstream.MessageHandler, log zerolog.Logger) *keep.Consumer {
	return keep.New(keep.Config{JS: js, Stream: stream, Consumer: cfg, Handle: handle,
		Opts: []jetstream.PullConsumeOpt{jetstream.PullExpiry(relayPullExpiry)}, Log: log})
}

// keepUntil keeps k until ctx ends, then stops consuming and returns once
// the consume has stopped (a handler may still be running).
func keepUntil(ctx context.Context, k *keep.Consumer) {
	defer k.Stop()
	k.Keep(ctx)
}

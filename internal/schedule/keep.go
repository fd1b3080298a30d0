package schedule

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// keptConsumer consumes one durable consumer of a relay and keeps it in
// existence. nats.go ends a Consume for good when the server says the
// consumer was deleted (409 Consumer Deleted: `nats consumer rm`, a
// stream restored from a backup), and the pulls of a consumer the server
// forgot find no responder; either way the relay would relay nothing
// until its process restarted, while delayed submissions and ticks pile
// up. keep notices (the consume stopped, or an error that may mean the
// consumer is gone), asks the server, and creates the consumer again from
// the same configuration and consumes it anew, as internal/scheduler keeps
// its partition consumers. What no relay acknowledged is still in the
// stream and is delivered again.
type keptConsumer struct {
	js     jetstream.JetStream
	stream string
	cfg    jetstream.ConsumerConfig
	handle jetstream.MessageHandler
	log    zerolog.Logger
	// suspect holds one pending "the consumer may be gone".
	suspect chan struct{}

	mu sync.Mutex
	cc jetstream.ConsumeContext
}

// keepCheckInterval is how soon keep acts on a sign that the consumer is
// gone, and the wait before it acts on the next one. The wait doubles, up
// to keepMaxBackoff, while the consumer keeps needing to be restored (a
// create the server refuses, a consume that keeps stopping).
const (
	keepCheckInterval = time.Second
	keepMaxBackoff    = 30 * time.Second
)

// keepRequestTimeout bounds restoring a consumer: its info and create.
const keepRequestTimeout = 5 * time.Second

// keepPullExpiry is the expiry of the relays' pull requests. The server
// heartbeats a waiting pull every half of it, and a consume that misses
// two heartbeats says so (jetstream.ErrNoHeartbeat), which makes keep ask
// whether the consumer still exists. A consumer lost without a word (its
// deletion raced with a pull, or a server forgot it) is thus noticed
// within this time rather than the 30 s of the default expiry. An idle
// relay pulls once per expiry.
const keepPullExpiry = 3 * time.Second

func newKeptConsumer(js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig, handle jetstream.MessageHandler, log zerolog.Logger) *keptConsumer {
	return &keptConsumer{js: js, stream: stream, cfg: cfg, handle: handle, suspect: make(chan struct{}, 1),
		log: log.With().Str("consumer", cfg.Durable).Logger()}
}

// start creates (or updates) the consumer and consumes it.
func (k *keptConsumer) start(ctx context.Context) error {
	cons, err := k.js.CreateOrUpdateConsumer(ctx, k.stream, k.cfg)
	if err != nil {
		return fmt.Errorf("consumer %s on %s: %w", k.cfg.Durable, k.stream, err)
	}
	cc, err := cons.Consume(k.handle, jetstream.ConsumeErrHandler(k.onError), jetstream.PullExpiry(keepPullExpiry))
	if err != nil {
		return fmt.Errorf("consume %s on %s: %w", k.cfg.Durable, k.stream, err)
	}
	k.mu.Lock()
	k.cc = cc
	k.mu.Unlock()
	return nil
}

func (k *keptConsumer) current() jetstream.ConsumeContext {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cc
}

// onError is the consume error handler: errors that may mean the server
// has no such consumer mark it suspect.
func (k *keptConsumer) onError(_ jetstream.ConsumeContext, err error) {
	if errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) {
		select {
		case k.suspect <- struct{}{}:
		default:
		}
	}
	if !errors.Is(err, jetstream.ErrNoHeartbeat) {
		k.log.Debug().Err(err).Msg("consume")
	}
}

// run keeps the consumer, started by start, until ctx ends; then it stops
// consuming and returns once the consume has stopped (a handler may still
// be running).
func (k *keptConsumer) run(ctx context.Context) {
	defer func() {
		cc := k.current()
		cc.Stop()
		<-cc.Closed()
	}()
	wait := keepCheckInterval
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.suspect:
		case <-k.current().Closed():
		}
		switch k.restore(ctx) {
		case restoreNotNeeded:
			wait = keepCheckInterval
		case restoreDone:
			wait = min(2*wait, keepMaxBackoff)
		case restoreFailed:
			// Not restored (the server cannot say yet, or refused): try
			// again after the wait even if no new sign comes.
			wait = min(2*wait, keepMaxBackoff)
			select {
			case k.suspect <- struct{}{}:
			default:
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// restoreOutcome is what restore did.
type restoreOutcome int

const (
	restoreNotNeeded restoreOutcome = iota // there, and consumed
	restoreDone                            // consumed anew
	restoreFailed                          // could not tell, or could not create it
)

// restore consumes the consumer anew, creating it again, if the server no
// longer has it or the consume has stopped.
func (k *keptConsumer) restore(ctx context.Context) restoreOutcome {
	if ctx.Err() != nil {
		return restoreNotNeeded
	}
	stopped := isClosed(k.current().Closed())
	rctx, cancel := context.WithTimeout(ctx, keepRequestTimeout)
	defer cancel()
	_, err := k.js.Consumer(rctx, k.stream, k.cfg.Durable)
	gone := errors.Is(err, jetstream.ErrConsumerNotFound)
	switch {
	case gone:
	case err != nil:
		return restoreFailed
	case !stopped:
		return restoreNotNeeded
	}
	k.current().Stop()
	if err := k.start(rctx); err != nil {
		k.log.Warn().Err(err).Msg("re-create consumer failed; trying again")
		return restoreFailed
	}
	if gone {
		k.log.Warn().Msg("consumer re-created: the server no longer had it")
	} else {
		k.log.Warn().Msg("consuming again: the consume had stopped")
	}
	return restoreDone
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

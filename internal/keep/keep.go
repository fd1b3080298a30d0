// Package keep keeps a durable JetStream consumer consumed: nats.go ends a
// Consume for good when the server says the consumer was deleted (409
// Consumer Deleted: `nats consumer rm`, a stream restored from a backup),
// and the pulls of a consumer a restarted server forgot (memory storage)
// find no responder and no heartbeats come. Any such sign makes Keep ask
// the server whether the consumer exists and, if not, create it again and
// consume it anew: what no client acknowledged is still in the stream and
// is delivered again. The scheduler's partition consumers and the schedule
// and delay relays use it.
package keep

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

// CheckInterval is how often Keep asks the server about the consumer at
// most: missed heartbeats come in bursts while a server restarts. It
// doubles, up to MaxBackoff, while the consumer keeps needing to be
// restored (a create the server refuses, a consume that keeps stopping).
const (
	CheckInterval = time.Second
	MaxBackoff    = 30 * time.Second
)

// RequestTimeout bounds restoring a consumer: its info and create.
const RequestTimeout = 5 * time.Second

// ErrDrained: the consumer was drained meanwhile; it is not consumed again.
var ErrDrained = errors.New("consumer drained")

// Config says what to consume and how.
type Config struct {
	JS       jetstream.JetStream
	Stream   string
	Consumer jetstream.ConsumerConfig
	Handle   jetstream.MessageHandler
	// Opts are the Consume options; Keep adds its error handler.
	Opts []jetstream.PullConsumeOpt
	// Replace, if set, is called when the server refuses to create the
	// consumer (createErr): it may make way (e.g. delete a consumer an
	// earlier release created with another storage type) and return nil
	// for the create to be tried once more.
	Replace func(ctx context.Context, createErr error) error
	Log     zerolog.Logger
}

// Consumer is a kept consumer.
type Consumer struct {
	cfg Config
	log zerolog.Logger
	// suspect holds one pending "the consumer may be gone".
	suspect chan struct{}

	mu      sync.Mutex
	cc      jetstream.ConsumeContext
	drained bool
}

// New returns a kept consumer; Start consumes it, Keep keeps it.
func New(cfg Config) *Consumer {
	k := &Consumer{cfg: cfg, suspect: make(chan struct{}, 1), log: cfg.Log.With().Str("consumer", cfg.Consumer.Durable).Logger()}
	k.cfg.Opts = append(append([]jetstream.PullConsumeOpt(nil), cfg.Opts...), jetstream.ConsumeErrHandler(k.onError))
	return k
}

// Start creates (or updates) the consumer and consumes it.
func (k *Consumer) Start(ctx context.Context) error {
	c := &k.cfg
	cons, err := c.JS.CreateOrUpdateConsumer(ctx, c.Stream, c.Consumer)
	if err != nil && c.Replace != nil {
		if rerr := c.Replace(ctx, err); rerr != nil {
			return fmt.Errorf("consumer %s on %s: %w", c.Consumer.Durable, c.Stream, rerr)
		}
		cons, err = c.JS.CreateOrUpdateConsumer(ctx, c.Stream, c.Consumer)
	}
	if err != nil {
		return fmt.Errorf("consumer %s on %s: %w", c.Consumer.Durable, c.Stream, err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.drained {
		return ErrDrained
	}
	cc, err := cons.Consume(c.Handle, c.Opts...)
	if err != nil {
		return fmt.Errorf("consume %s: %w", c.Consumer.Durable, err)
	}
	k.cc = cc
	return nil
}

// onError is the consume error handler: errors that may mean the server
// has no such consumer mark it suspect.
func (k *Consumer) onError(_ jetstream.ConsumeContext, err error) {
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

// Keep restores the consumer, started by Start, whenever it is suspect or
// its consume stopped by itself (a deleted consumer ends it), until ctx
// ends. It does not stop the consume then: Stop or Drain does.
func (k *Consumer) Keep(ctx context.Context) {
	wait := CheckInterval
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.suspect:
		case <-k.current().Closed():
		}
		switch k.restore(ctx) {
		case restoreNotNeeded:
			wait = CheckInterval
		case restoreDone:
			wait = min(2*wait, MaxBackoff)
		case restoreFailed:
			// Not restored (the server cannot say yet, or refused): ask
			// again after the wait even if no new sign comes.
			wait = min(2*wait, MaxBackoff)
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

func (k *Consumer) current() jetstream.ConsumeContext {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cc
}

// restoreOutcome is what restore did.
type restoreOutcome int

const (
	restoreNotNeeded restoreOutcome = iota // there, and consumed (or drained)
	restoreDone                            // consumed anew
	restoreFailed                          // could not tell, or could not create it
)

// restore consumes the consumer anew if the server no longer has it or the
// consume has stopped.
func (k *Consumer) restore(ctx context.Context) restoreOutcome {
	k.mu.Lock()
	stopped := isClosed(k.cc.Closed())
	drained := k.drained
	k.mu.Unlock()
	if drained || ctx.Err() != nil {
		return restoreNotNeeded
	}
	rctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	_, err := k.cfg.JS.Consumer(rctx, k.cfg.Stream, k.cfg.Consumer.Durable)
	gone := errors.Is(err, jetstream.ErrConsumerNotFound)
	switch {
	case gone:
	case err != nil:
		return restoreFailed
	case !stopped:
		return restoreNotNeeded
	}
	k.mu.Lock()
	k.cc.Stop()
	k.mu.Unlock()
	if err := k.Start(rctx); err != nil {
		if errors.Is(err, ErrDrained) {
			return restoreNotNeeded
		}
		k.log.Warn().Err(err).Msg("re-create consumer failed; trying again")
		return restoreFailed
	}
	if gone {
		k.log.Warn().Msg("consumer re-created: the server had forgotten it")
	} else {
		k.log.Warn().Msg("consuming again: the consume had stopped")
	}
	return restoreDone
}

// Drain stops consuming after the messages already fetched are handled;
// Keep will not start it again.
func (k *Consumer) Drain() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.drained = true
	k.cc.Drain()
}

// Stop stops consuming at once and returns when the consume has stopped
// (a handler may still be running); Keep will not start it again.
func (k *Consumer) Stop() {
	k.mu.Lock()
	k.drained = true
	cc := k.cc
	k.mu.Unlock()
	cc.Stop()
	<-cc.Closed()
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

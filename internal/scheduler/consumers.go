package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// consume starts one pinned consumer per partition of submissions and of
// results, and one shared consumer of bare submissions, each kept by a
// goroutine in bg until ctx ends.
func (s *Scheduler) consume(ctx context.Context, bg *sync.WaitGroup) ([]*keptConsumer, error) {
	var out []*keptConsumer
	s.dropLegacyConsumers(ctx)
	start := func(stream string, cfg jetstream.ConsumerConfig, pinned bool, handle jetstream.MessageHandler) error {
		k := &keptConsumer{s: s, stream: stream, cfg: cfg, handle: handle, suspect: make(chan struct{}, 1)}
		k.opts = []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(512), jetstream.ConsumeErrHandler(k.onError)}
		if pinned {
			// The server renews a pin only when its holder sends a new pull
			// request. With the default 30 s expiry a quiet partition lost
			// its pin every PinnedTTL and flipped to another scheduler,
			// which read the job afresh while the old owner's timers still
			// acted on its stale copy (seen: 582 of 600 jobs accepted by
			// both schedulers). Pull again well within the TTL.
			k.opts = append(k.opts, jetstream.PullPriorityGroup(streams.PriorityGroupOwner),
				jetstream.PullExpiry(pinnedPullExpiry(s.cfg.PinnedTTL.Std())))
		}
		if err := k.start(ctx); err != nil {
			return err
		}
		out = append(out, k)
		bg.Add(1)
		go func() {
			defer bg.Done()
			k.keep(ctx)
		}()
		return nil
	}
	ack, ttl := s.cfg.AckWait.Std(), s.cfg.PinnedTTL.Std()
	for p := range s.cfg.Partitions {
		sub, err := streams.PartitionConsumer("submit", p, protocol.StoredSubmitFilter(p), ack, ttl)
		if err != nil {
			return out, err
		}
		if err := start(protocol.StreamSubmit, sub, true, s.onSubmission); err != nil {
			return out, err
		}
		res, err := streams.PartitionConsumer("results", p, protocol.StoredResultFilter(p), ack, ttl)
		if err != nil {
			return out, err
		}
		if err := start(protocol.StreamResults, res, true, s.onResult); err != nil {
			return out, err
		}
	}
	bare, err := streams.SchedulerConsumer()
	if err != nil {
		return out, err
	}
	bare.Durable, bare.FilterSubject, bare.AckWait = "scheduler-submit-bare", protocol.SubjectSubmit, ack
	bare.Description = "Submissions on the bare warden.submit subject, taken by any scheduler."
	return out, start(protocol.StreamSubmit, bare, false, s.onSubmission)
}

// pinnedPullExpiry is the expiry of a pinned consumer's pull requests:
// half the pin's TTL, and at least the 1 s the client allows.
func pinnedPullExpiry(ttl time.Duration) time.Duration {
	return max(ttl/2, time.Second)
}

// dropLegacyConsumers removes the unfiltered consumer of earlier versions:
// a work-queue stream refuses consumers whose filters overlap.
func (s *Scheduler) dropLegacyConsumers(ctx context.Context) {
	for _, stream := range []string{protocol.StreamSubmit, protocol.StreamResults} {
		st, err := s.js.Stream(ctx, stream)
		if err != nil {
			continue
		}
		if info, err := st.Consumer(ctx, protocol.ConsumerScheduler); err == nil && info.CachedInfo().Config.FilterSubject == "" {
			_ = st.DeleteConsumer(ctx, protocol.ConsumerScheduler)
		}
	}
}

// keptConsumer consumes one durable consumer and keeps it in existence.
// The partition consumers keep their state in memory, so a lone server
// that restarts (or a whole cluster) forgets them; their pulls then find
// no responder and no heartbeats come. Any such sign makes keep ask the
// server whether the consumer exists and, if not, create it again and
// consume it anew: the messages no scheduler acknowledged are still in the
// work-queue stream and are delivered again.
type keptConsumer struct {
	s      *Scheduler
	stream string
	cfg    jetstream.ConsumerConfig
	opts   []jetstream.PullConsumeOpt
	handle jetstream.MessageHandler
	// suspect holds one pending "the consumer may be gone".
	suspect chan struct{}

	mu      sync.Mutex
	cc      jetstream.ConsumeContext
	drained bool
}

// keepCheckInterval bounds how often keep asks the server about the
// consumer: missed heartbeats come in bursts while a server restarts.
const keepCheckInterval = time.Second

// keepRequestTimeout bounds restoring a consumer: its info and create.
const keepRequestTimeout = 5 * time.Second

// start creates (or updates) the consumer and consumes it.
func (k *keptConsumer) start(ctx context.Context) error {
	cons, err := k.s.js.CreateOrUpdateConsumer(ctx, k.stream, k.cfg)
	if err != nil && k.replace(ctx) {
		cons, err = k.s.js.CreateOrUpdateConsumer(ctx, k.stream, k.cfg)
	}
	if err != nil {
		return fmt.Errorf("consumer %s on %s: %w", k.cfg.Durable, k.stream, err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.drained {
		return nil
	}
	cc, err := cons.Consume(k.handle, k.opts...)
	if err != nil {
		return fmt.Errorf("consume %s: %w", k.cfg.Durable, err)
	}
	k.cc = cc
	return nil
}

// replace deletes the consumer if an earlier release created it with
// another storage type, which the server does not update, and reports
// whether the create is worth trying again (it also is when another
// scheduler replaced it meanwhile).
func (k *keptConsumer) replace(ctx context.Context) bool {
	old, err := k.s.js.Consumer(ctx, k.stream, k.cfg.Durable)
	if err != nil {
		return false
	}
	if old.CachedInfo().Config.MemoryStorage == k.cfg.MemoryStorage {
		return true
	}
	if err := k.s.js.DeleteConsumer(ctx, k.stream, k.cfg.Durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false
	}
	k.s.log.Info().Str("consumer", k.cfg.Durable).Bool("memory_storage", k.cfg.MemoryStorage).
		Msg("consumer re-created with the storage type this release uses")
	return true
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
		k.s.log.Debug().Err(err).Str("consumer", k.cfg.Durable).Msg("consume")
	}
}

// keep restores the consumer whenever it is suspect or its consume context
// stopped by itself (a deleted consumer ends it), until ctx ends.
func (k *keptConsumer) keep(ctx context.Context) {
	for {
		k.mu.Lock()
		closed := k.cc.Closed()
		k.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-k.suspect:
		case <-closed:
		}
		if !k.restore(ctx) {
			// Not restored (the server cannot say yet): ask again soon
			// even if no new error comes.
			select {
			case k.suspect <- struct{}{}:
			default:
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(keepCheckInterval):
		}
	}
}

// restore consumes the consumer anew if the server no longer has it or the
// consume context has stopped. It reports false when it could not tell or
// could not create it.
func (k *keptConsumer) restore(ctx context.Context) bool {
	k.mu.Lock()
	stopped := isClosed(k.cc.Closed())
	drained := k.drained
	k.mu.Unlock()
	if drained || ctx.Err() != nil {
		return true
	}
	rctx, cancel := context.WithTimeout(ctx, keepRequestTimeout)
	defer cancel()
	_, err := k.s.js.Consumer(rctx, k.stream, k.cfg.Durable)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
	case err != nil:
		return false
	case !stopped:
		return true // there, and consumed
	}
	k.mu.Lock()
	k.cc.Stop()
	k.mu.Unlock()
	if err := k.start(rctx); err != nil {
		k.s.log.Warn().Err(err).Str("consumer", k.cfg.Durable).Msg("re-create consumer failed; trying again")
		return false
	}
	k.s.log.Warn().Str("consumer", k.cfg.Durable).Msg("consumer re-created: the server had forgotten it")
	return true
}

// drain stops consuming after the messages already fetched are handled;
// keep will not start it again.
func (k *keptConsumer) drain() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.drained = true
	k.cc.Drain()
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

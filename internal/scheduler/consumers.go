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

// keepCheckInterval is how often keep asks the server about the consumer
// at most: missed heartbeats come in bursts while a server restarts. It
// doubles, up to keepMaxBackoff, while the consumer keeps needing to be
// restored (a create the server refuses, a consume that keeps stopping).
const (
	keepCheckInterval = time.Second
	keepMaxBackoff    = 30 * time.Second
)

// keepRequestTimeout bounds restoring a consumer: its info and create.
const keepRequestTimeout = 5 * time.Second

// errDrained: the consumer was drained meanwhile; it is not consumed again.
var errDrained = errors.New("consumer drained")

// start creates (or updates) the consumer and consumes it.
func (k *keptConsumer) start(ctx context.Context) error {
	cons, err := k.s.js.CreateOrUpdateConsumer(ctx, k.stream, k.cfg)
	if err != nil {
		if rerr := k.replace(ctx, err); rerr != nil {
			return fmt.Errorf("consumer %s on %s: %w", k.cfg.Durable, k.stream, rerr)
		}
		cons, err = k.s.js.CreateOrUpdateConsumer(ctx, k.stream, k.cfg)
	}
	if err != nil {
		return fmt.Errorf("consumer %s on %s: %w", k.cfg.Durable, k.stream, err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.drained {
		return errDrained
	}
	cc, err := cons.Consume(k.handle, k.opts...)
	if err != nil {
		return fmt.Errorf("consume %s: %w", k.cfg.Durable, err)
	}
	k.cc = cc
	return nil
}

// replaceAttempts × replaceWait bounds how long start waits for schedulers
// of an earlier release to stop using a consumer it must replace: past two
// pin TTLs (5 s each by default), a pin and its pull requests have expired.
const (
	replaceAttempts = 24
	replaceWait     = 500 * time.Millisecond
)

// replace makes way for a create the server refused (streams.ReplaceStorage):
// a consumer an earlier release created on disk is deleted once no
// scheduler uses it (no pinned client, no waiting pull, nothing
// unacknowledged), and nil returned so that the create is tried again. A
// consumer still in use after the wait is an error: schedulers of the
// earlier release must stop first.
func (k *keptConsumer) replace(ctx context.Context, createErr error) error {
	for range replaceAttempts {
		replaced, err := streams.ReplaceStorage(ctx, k.s.js, k.stream, k.cfg, consumerInUse)
		if !errors.Is(err, streams.ErrConsumerInUse) {
			if replaced {
				k.s.log.Info().Str("consumer", k.cfg.Durable).Bool("memory_storage", k.cfg.MemoryStorage).
					Msg("consumer re-created with the storage type this release uses")
			}
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(replaceWait):
		}
	}
	return fmt.Errorf("%w; it was created with another storage type by an earlier release whose schedulers still use it: stop them first (docs/protocol.md, \"Durable consumers\")", createErr)
}

// consumerInUse reports whether some client consumes the consumer now: it
// holds the pin, has pull requests waiting, or has messages unacknowledged.
func consumerInUse(info *jetstream.ConsumerInfo) bool {
	if info.NumWaiting > 0 || info.NumAckPending > 0 {
		return true
	}
	for _, g := range info.PriorityGroups {
		if g.PinnedClientID != "" {
			return true
		}
	}
	return false
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
	wait := keepCheckInterval
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
		switch k.restore(ctx) {
		case restoreNotNeeded:
			wait = keepCheckInterval
		case restoreDone:
			wait = min(2*wait, keepMaxBackoff)
		case restoreFailed:
			// Not restored (the server cannot say yet, or refused): ask
			// again after the wait even if no new error comes.
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
	restoreNotNeeded restoreOutcome = iota // there, and consumed (or drained)
	restoreDone                            // consumed anew
	restoreFailed                          // could not tell, or could not create it
)

// restore consumes the consumer anew if the server no longer has it or the
// consume context has stopped.
func (k *keptConsumer) restore(ctx context.Context) restoreOutcome {
	k.mu.Lock()
	stopped := isClosed(k.cc.Closed())
	drained := k.drained
	k.mu.Unlock()
	if drained || ctx.Err() != nil {
		return restoreNotNeeded
	}
	rctx, cancel := context.WithTimeout(ctx, keepRequestTimeout)
	defer cancel()
	_, err := k.s.js.Consumer(rctx, k.stream, k.cfg.Durable)
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
	if err := k.start(rctx); err != nil {
		if errors.Is(err, errDrained) {
			return restoreNotNeeded
		}
		k.s.log.Warn().Err(err).Str("consumer", k.cfg.Durable).Msg("re-create consumer failed; trying again")
		return restoreFailed
	}
	if gone {
		k.s.log.Warn().Str("consumer", k.cfg.Durable).Msg("consumer re-created: the server had forgotten it")
	} else {
		k.s.log.Warn().Str("consumer", k.cfg.Durable).Msg("consuming again: the consume had stopped")
	}
	return restoreDone
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

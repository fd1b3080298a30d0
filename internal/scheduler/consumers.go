package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/keep"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// consume starts one pinned consumer per partition of submissions and of
// results, and one shared consumer of bare submissions, each kept by a
// goroutine in bg until ctx ends.
func (s *Scheduler) consume(ctx context.Context, bg *sync.WaitGroup) ([]*keep.Consumer, error) {
	var out []*keep.Consumer
	s.dropLegacyConsumers(ctx)
	start := func(stream string, cfg jetstream.ConsumerConfig, pinned bool, handle jetstream.MessageHandler) error {
		opts := []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(512)}
		if pinned {
			// The server renews a pin only when its holder sends a new pull
			// request. With the default 30 s expiry a quiet partition lost
			// its pin every PinnedTTL and flipped to another scheduler,
			// which read the job afresh while the old owner's timers still
			// acted on its stale copy (seen: 582 of 600 jobs accepted by
			// both schedulers). Pull again well within the TTL.
			opts = append(opts, jetstream.PullPriorityGroup(streams.PriorityGroupOwner),
				jetstream.PullExpiry(pinnedPullExpiry(s.cfg.PinnedTTL.Std())))
		}
		k := keep.New(keep.Config{JS: s.js, Stream: stream, Consumer: cfg, Handle: handle, Opts: opts,
			Replace: s.replacer(stream, cfg), Log: s.log})
		if err := k.Start(ctx); err != nil {
			return err
		}
		out = append(out, k)
		bg.Add(1)
		go func() {
			defer bg.Done()
			k.Keep(ctx)
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

// replaceFor bounds how long start waits for schedulers of an earlier
// release to stop using a consumer it must replace: past two pin TTLs (5 s
// each by default), a pin and its pull requests have expired. It looks
// again every replaceWait. A bound in time, not in tries: on a loaded
// machine 24 tries of a few requests each took over 30 s to refuse.
const (
	replaceFor  = 12 * time.Second
	replaceWait = 500 * time.Millisecond
)

// replacer makes way for a create the server refused (streams.ReplaceStorage):
// a consumer an earlier release created on disk is deleted once no
// scheduler uses it (no pinned client, no waiting pull, nothing
// unacknowledged), and nil returned so that the create is tried again. A
// consumer still in use after the wait is an error: schedulers of the
// earlier release must stop first.
func (s *Scheduler) replacer(stream string, cfg jetstream.ConsumerConfig) func(context.Context, error) error {
	return func(ctx context.Context, createErr error) error {
		until := time.Now().Add(replaceFor)
		for {
			replaced, err := streams.ReplaceStorage(ctx, s.js, stream, cfg, consumerInUse)
			if !errors.Is(err, streams.ErrConsumerInUse) {
				if replaced {
					s.log.Info().Str("consumer", cfg.Durable).Bool("memory_storage", cfg.MemoryStorage).
						Msg("consumer re-created with the storage type this release uses")
				}
				return err
			}
			if !time.Now().Add(replaceWait).Before(until) {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(replaceWait):
			}
		}
		return fmt.Errorf("%w; it was created with another storage type by an earlier release whose schedulers still use it: stop them first (docs/protocol.md, \"Durable consumers\")", createErr)
	}
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

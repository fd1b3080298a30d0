package agent

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Retry delays after a failed pull: all errors are transient, none is
// retried in a tight loop.
const (
	minFetchBackoff = 250 * time.Millisecond
	maxFetchBackoff = 5 * time.Second
)

// dispatch pulls one task at a time, and only when a slot is free, so the
// agent never holds a task it cannot start (the consumer's max_ack_pending
// is max_concurrent too). It returns when fetchCtx ends; the tasks it
// started run on under workCtx and are tracked by tasks.
func (a *Agent) dispatch(fetchCtx, workCtx context.Context, tasks *sync.WaitGroup) {
	slots := make(chan struct{}, a.cfg.MaxConcurrent)
	backoff := minFetchBackoff
	for {
		// Drained by an operator, or over a limit the supervisor lowered.
		for a.held.Load() || a.stats.inFlight.Load() >= int64(a.limit.Load()) && len(slots) > 0 {
			if !sleepCtx(fetchCtx, 100*time.Millisecond) {
				return
			}
		}
		select {
		case slots <- struct{}{}:
		case <-fetchCtx.Done():
			return
		}
		msg, err := a.next(fetchCtx)
		if err != nil {
			<-slots
			if fetchCtx.Err() != nil {
				return
			}
			if isIdle(err) {
				backoff = minFetchBackoff
				continue
			}
			a.log.Warn().Err(err).Dur("retry_in", backoff).Msg("pull tasks failed")
			if !sleepCtx(fetchCtx, backoff) {
				return
			}
			backoff = min(2*backoff, maxFetchBackoff)
			if errorsIsAny(err, jetstream.ErrConsumerNotFound, jetstream.ErrConsumerDeleted) {
				a.recreateConsumer(fetchCtx)
			}
			continue
		}
		backoff = minFetchBackoff
		if fetchCtx.Err() != nil {
			// Arrived as we stopped: hand it back rather than start work.
			a.handBack(msg)
			<-slots
			return
		}
		suspect := isSuspect(deliveryOf(msg), msg.Headers().Get(protocol.HeaderRecoveries))
		done := make(chan struct{})
		tasks.Add(1)
		go func() {
			defer tasks.Done()
			defer func() { <-slots }()
			defer close(done)
			a.process(workCtx, msg)
		}()
		if suspect {
			// Fetch nothing more until the suspect has run: a task fetched
			// now would wait behind it and, if it is poison, share its fate
			// (each crash counts a delivery of every task we hold).
			select {
			case <-done:
			case <-fetchCtx.Done():
				return
			}
		}
	}
}

// deliveryOf is the message's delivery count, 1 if unknown.
func deliveryOf(msg jetstream.Msg) uint64 {
	if md, err := msg.Metadata(); err == nil {
		return md.NumDelivered
	}
	return 1
}

// next long-polls for one task for at most FetchWait.
func (a *Agent) next(ctx context.Context) (jetstream.Msg, error) {
	fctx, cancel := context.WithTimeout(ctx, a.cfg.FetchWait.Std())
	defer cancel()
	return a.cons.Next(jetstream.FetchContext(fctx))
}

// isIdle reports a pull that simply found nothing.
func isIdle(err error) bool {
	return errorsIsAny(err, nats.ErrTimeout, jetstream.ErrNoMessages, context.DeadlineExceeded)
}

func (a *Agent) recreateConsumer(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	cons, err := a.ensureConsumer(sctx)
	if err != nil {
		a.log.Warn().Err(err).Msg("re-create task consumer failed")
		return
	}
	a.cons = cons // only dispatch reads a.cons
	a.log.Warn().Msg("task consumer was missing: re-created")
}

// sleepCtx waits d or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// ackNak asks the server to redeliver a message now.
var ackNak = []byte("-NAK")

// handBack returns a task to the server for immediate redelivery. The nak is
// sent as a request so that we know the server has it before we exit; if it
// is lost, the task comes back after the lease anyway.
func (a *Agent) handBack(msg jetstream.Msg) {
	a.stats.handedBack.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := a.nc.RequestWithContext(ctx, msg.Reply(), ackNak); err != nil {
		a.log.Warn().Err(err).Msg("hand-back not confirmed; the task comes back after the lease")
	}
}

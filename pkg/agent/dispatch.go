package agent

import (
	"context"
	"errors"
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

// dispatch pulls tasks only for free slots, so the agent never holds a
// task it cannot start (the consumer's max_ack_pending is max_concurrent
// too): one pull request asks for as many tasks as there are free slots
// within the limit, and each task starts as it arrives. The next pull is
// made when that request is fulfilled or expires. It returns when fetchCtx
// ends; the tasks it started run on under workCtx and are tracked by tasks.
//
// While the consumer has unacked deliveries the agent does not hold (those
// of a run that crashed, awaiting redelivery), it pulls one task at a time:
// they come back as suspects, and fetched together they would all be in
// hand when the first of them, if poison, kills the process again. Each
// crash counts a delivery of every task in hand, so bystanders fetched with
// a poison task would reach max_deliver with it and be dead-lettered.
func (a *Agent) dispatch(fetchCtx, workCtx context.Context, tasks *sync.WaitGroup) {
	slots := make(chan struct{}, a.cfg.MaxConcurrent)
	backoff := minFetchBackoff
	alone := true      // until the consumer shows no delivery this run lacks
	recreated := false // the consumer, since the last pull that did not fail
	// Held back, the loop keeps the queue depth true (depth.go).
	tick := time.NewTicker(a.cfg.HeartbeatInterval.Std())
	defer tick.Stop()
	for {
		if !a.takeSlot(fetchCtx, slots, tick.C) {
			return
		}
		if a.heldBack(slots) {
			// Drained by an operator, or over a limit the supervisor
			// lowered: asked once a slot is taken, so that a drain that
			// came while every slot was busy holds too. Looked at again
			// every 100 ms; at max_concurrent takeSlot waits for a free
			// slot by itself.
			<-slots
			a.probeDepth(fetchCtx)
			if !sleepCtx(fetchCtx, 100*time.Millisecond) {
				return
			}
			continue
		}
		if alone {
			// Abandoned handlers (runHandler) hold slots without a delivery.
			alone = a.unackedElsewhere(fetchCtx, max(0, len(slots)-1-int(a.stats.abandoned.Load())))
		}
		n := 1
	more:
		for !alone && len(slots) < int(a.limit.Load()) {
			select {
			case slots <- struct{}{}:
				n++
			default:
				break more
			}
		}
		got, suspects, err := a.pull(fetchCtx, workCtx, n, slots, tasks)
		if len(suspects) > 0 {
			alone = true // more may be waiting for redelivery
		}
		for range n - got {
			<-slots
		}
		if got == 0 {
			a.checkGhosts(fetchCtx) // an idle moment: see ghosts.go
		}
		if err != nil && got == 0 {
			if fetchCtx.Err() != nil {
				return
			}
			if isIdle(err) || errors.Is(err, context.Canceled) { // nothing came, or stopPull
				backoff = minFetchBackoff
				recreated = false
				continue
			}
			// The task consumer keeps its state in memory (see
			// streams/consumer_task.json): a lone nats-server that
			// restarted has forgotten it, and a pull to it finds no
			// responder. Re-created, it is pulled from again at once the
			// first time; if pulls keep failing, they back off as for any
			// error.
			if a.consumerMissing(fetchCtx, err) && a.recreateConsumer(fetchCtx) && !recreated {
				recreated = true
				continue
			}
			a.log.Warn().Err(err).Dur("retry_in", backoff).Msg("pull tasks failed")
			if !a.retryWait(fetchCtx, backoff) {
				return
			}
			backoff = min(2*backoff, maxFetchBackoff)
			continue
		}
		backoff = minFetchBackoff
		recreated = false
		// Fetch nothing more until the suspects have run: a task fetched
		// now would wait behind them and, if one is poison, share its fate
		// (each crash counts a delivery of every task we hold).
		for _, done := range suspects {
			select {
			case <-done:
			case <-fetchCtx.Done():
				return
			}
		}
	}
}

// pull asks for n tasks in one pull request (waiting at most FetchWait) and
// starts each as it arrives, each on one of the n slots taken for it. It
// returns how many arrived, a channel per suspect (closed when it has run)
// and the request's error.
func (a *Agent) pull(fetchCtx, workCtx context.Context, n int, slots chan struct{}, tasks *sync.WaitGroup) (int, []chan struct{}, error) {
	fctx, cancel := context.WithTimeout(fetchCtx, a.cfg.FetchWait.Std())
	defer cancel()
	// A drain or a lower limit ends the request early (stopPull), so no
	// more tasks arrive for slots that are no longer free.
	a.pullCancel.Store(&cancel)
	defer a.pullCancel.Store(nil)
	if a.heldBack(slots) {
		// A drain or limit that came before the store above found no
		// request to stop (its stopPull ran first): this one stops itself.
		cancel()
	}
	batch, err := a.cons.Fetch(n, jetstream.FetchContext(fctx))
	if err != nil {
		return 0, nil, err
	}
	got := 0
	measured := false // the queue depth, by this request (depth.go)
	var suspects []chan struct{}
	for msg := range batch.Messages() {
		got++
		// The reply subject is parsed once per task: it was three times,
		// 4% of a fleet's CPU at full load.
		var delivery uint64 = 1
		if md, err := msg.Metadata(); err == nil {
			a.stats.queueDepth.Store(int64(md.NumPending)) // still waiting on the consumer
			measured = true
			delivery = md.NumDelivered
		}
		if fetchCtx.Err() != nil {
			// Arrived as we stopped: hand it back rather than start work.
			a.handBack(msg)
			<-slots
			continue
		}
		done := make(chan struct{})
		if isSuspect(delivery, msg.Headers().Get(protocol.HeaderRecoveries)) {
			suspects = append(suspects, done)
		}
		// Held from now on: counted in flight (ghosts.go) until process
		// has settled it and its handler, if one started, has returned.
		a.stats.inFlight.Add(1)
		hold := newTaskHold(func() {
			a.stats.inFlight.Add(-1)
			close(done)
			<-slots
		})
		tasks.Add(1)
		go func() {
			defer tasks.Done()
			a.process(workCtx, msg, delivery, hold)
		}()
	}
	if got < n && !errors.Is(fctx.Err(), context.Canceled) {
		a.stats.queueDepth.Store(0) // the request ended short: nothing was waiting
		measured = true
	}
	if measured {
		a.depthMeasured()
	}
	return got, suspects, batch.Error()
}

// repullOnReconnect ends the pull request in progress whenever the
// connection comes back, until ctx ends: a server that restarted has
// forgotten it, and the client would notice only when two of the
// request's 5 s heartbeats had failed to come. Tasks waited ~10 s after
// every nats-server restart (the chaos suite's "longest wait for a
// dispatch"); the dispatch loop now asks again at once. It then makes
// sure the task consumer exists (restoreConsumer).
//
// The restore runs beside this loop, one at a time, and a new reconnect
// ends the previous one: run inline, its requests to a connection that
// dropped again would hold the loop for their timeout, and with it the
// repull after that second reconnect.
func (a *Agent) repullOnReconnect(ctx context.Context) {
	ch := a.nc.StatusChanged(nats.CONNECTED)
	defer a.nc.RemoveStatusListener(ch)
	var restoring sync.WaitGroup
	stopRestore := func() {}
	defer func() { stopRestore(); restoring.Wait() }()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ch:
			if !ok {
				return // the connection closed
			}
			a.log.Debug().Msg("reconnected: pulling again")
			a.stopPull()
			select { // and no retry waits out its backoff (retryWait)
			case a.reconnected <- struct{}{}:
			default:
			}
			stopRestore()
			restoring.Wait()
			rctx, cancel := context.WithCancel(ctx)
			stopRestore = cancel
			restoring.Add(1)
			go func() {
				defer restoring.Done()
				a.restoreConsumer(rctx)
			}()
		}
	}
}

// retryWait waits d after a failed pull, or less if the connection came
// back meanwhile (or just before: one extra pull costs nothing): pulls
// fail while a server restarts, and the backoff had grown to seconds by
// the time it was back. It reports false if ctx ended.
func (a *Agent) retryWait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-a.reconnected:
	case <-ctx.Done():
		return false
	}
	return true
}

// loopRequest is the context of a request the dispatch loop makes between
// pulls (consumer info): at most setupTimeout, and ended like a pull
// request by stopPull, so by a reconnect. A request lost in a server
// restart otherwise held the loop, and every task for the agent, for the
// whole setupTimeout (10 s; seen in the chaos suite after restarts).
func (a *Agent) loopRequest(ctx context.Context) (context.Context, context.CancelFunc) {
	rctx, cancel := context.WithTimeout(ctx, setupTimeout)
	a.pullCancel.Store(&cancel)
	return rctx, func() {
		a.pullCancel.Store(nil)
		cancel()
	}
}

// heldBack reports whether the agent may not fill the slots it has taken:
// drained by an operator, or holding more than the limit the supervisor
// set. Control stores held or limit before stopPull, and a pull stores its
// cancel before asking this, so one of the two always sees the other.
func (a *Agent) heldBack(slots chan struct{}) bool {
	return a.held.Load() || len(slots) > int(a.limit.Load())
}

// stopPull ends the pull request in progress, if any.
func (a *Agent) stopPull() {
	if c := a.pullCancel.Load(); c != nil {
		(*c)()
	}
}

// unackedElsewhere reports whether the task consumer counts more unacked
// deliveries than the held tasks this run has in hand: deliveries awaiting
// redelivery (a crashed run's), or lost in transit (see ghosts.go). If the
// consumer cannot be read it reports false: pulls go on as usual.
func (a *Agent) unackedElsewhere(ctx context.Context, held int) bool {
	ictx, cancel := a.loopRequest(ctx)
	defer cancel()
	info, err := a.cons.Info(ictx)
	if err != nil {
		a.log.Debug().Err(err).Msg("consumer info: pulling as usual")
		return false
	}
	return info.NumAckPending > held
}

// isIdle reports a pull that simply found nothing.
func isIdle(err error) bool {
	return errorsIsAny(err, nats.ErrTimeout, jetstream.ErrNoMessages, context.DeadlineExceeded)
}

// consumerMissing reports whether a failed pull means the server has no
// task consumer: deleted, or (kept in memory) forgotten by a restarted
// server. A pull finds no responder then, but also while a cluster elects
// the consumer's leader, so that case is confirmed with CONSUMER.INFO
// before anything is created (a create is a write to the cluster's
// metadata, from every agent at once).
func (a *Agent) consumerMissing(ctx context.Context, err error) bool {
	if errorsIsAny(err, jetstream.ErrConsumerNotFound, jetstream.ErrConsumerDeleted) {
		return true
	}
	if !errors.Is(err, nats.ErrNoResponders) {
		return false
	}
	lctx, cancel := a.loopRequest(ctx)
	defer cancel()
	// Bounded well below setupTimeout: while a cluster has no leader for
	// the consumer the question may go unanswered, and the loop should
	// back off and pull again rather than wait on it.
	ictx, icancel := context.WithTimeout(lctx, probeTimeout)
	defer icancel()
	gone, _ := a.consumerGone(ictx)
	return gone
}

// probeTimeout bounds consumerMissing's CONSUMER.INFO.
const probeTimeout = time.Second

// consumerGone asks the server (CONSUMER.INFO) whether it has no task
// consumer for this agent; err is the request's other errors.
func (a *Agent) consumerGone(ctx context.Context) (bool, error) {
	_, err := a.js.Consumer(ctx, protocol.TaskStream(a.shard), a.cfg.ID)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return true, nil
	}
	return false, err
}

// restoreWarnAfter: a restore still failing after this many tries says so.
const restoreWarnAfter = 5

// restoreConsumer makes sure, after a reconnect, that the task consumer
// exists. A lone server that restarted has forgotten it (it is kept in
// memory). The dispatch loop re-creates it when a pull finds no
// responder, but an agent whose slots are all taken, or that is drained,
// does not pull: the lease extensions of the tasks it runs would find no
// responder either, and it would lose them and run them again.
func (a *Agent) restoreConsumer(ctx context.Context) {
	// Tried until it is known to exist (or the next reconnect, or the
	// end): five tries over about 8 s gave up on a JetStream slower than
	// that to answer after a restart, and an agent whose slots were all
	// taken then lost every running task's lease.
	backoff := minFetchBackoff
	for try := 1; ; try++ {
		rctx, cancel := context.WithTimeout(ctx, setupTimeout)
		gone, err := a.consumerGone(rctx)
		if gone {
			if _, err = a.ensureConsumer(rctx); err == nil {
				a.log.Warn().Msg("task consumer re-created after a reconnect")
			}
		}
		cancel()
		if err == nil {
			return
		}
		if try == restoreWarnAfter {
			a.log.Warn().Err(err).Msg("task consumer not confirmed after a reconnect; trying on (running tasks' leases depend on it)")
		}
		if !sleepCtx(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, maxFetchBackoff)
	}
}

// recreateConsumer creates the task consumer again and reports whether it
// could. The tasks still in the work-queue stream are delivered afresh.
// Its requests end on a reconnect, as a pull does: a server shutting down
// answers pulls with no responder, and the re-creation then asked of it
// was lost with the connection and held the agent for setupTimeout (10 s
// of tasks waiting after a restart, seen in the chaos suite).
func (a *Agent) recreateConsumer(ctx context.Context) bool {
	sctx, cancel := a.loopRequest(ctx)
	defer cancel()
	cons, err := a.ensureConsumer(sctx)
	if err != nil {
		a.log.Warn().Err(err).Msg("re-create task consumer failed")
		return false
	}
	a.cons = cons // only dispatch reads a.cons
	a.log.Warn().Msg("task consumer re-created")
	return true
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

package agent

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// queue_depth (the heartbeat's count of the tasks waiting on the agent's
// consumer) is measured by the pulls: the pending count of the last task
// delivered, 0 after a request that ended short. An agent held back
// (drained, or over a lowered limit) does not pull, and its depth used to
// stay what its last pull saw. The supervisor's health assessment caps
// queue_depth (≥ 100: critical) and its healer drains such an agent, then
// moves its queue away after drain_timeout: the agent went on reporting
// the queue it no longer had, stayed critical, and stayed drained for
// good. So while held back, the dispatch loop reads the depth from its
// consumer's info instead (CONSUMER.INFO on its own consumer, which the
// agent role may ask), at most once a heartbeat interval and only when no
// pull measured it within that interval: a request per heartbeat of the
// few agents held back, none for the others.
//
// The count is the consumer's num_pending, the same count a pull reports:
// the tasks not yet delivered. Deliveries awaiting an ack (the tasks in
// flight, or a crashed run's awaiting redelivery) are not counted.
type depthProbe struct {
	next time.Time // no probe before then
}

// depthMeasured notes that a pull measured the queue depth just now.
// Only dispatch calls it.
func (a *Agent) depthMeasured() {
	a.depth.next = a.now().Add(a.cfg.HeartbeatInterval.Std())
}

// probeDepth reads the queue depth from the task consumer's info, unless
// it was measured less than a heartbeat interval ago. If the consumer
// cannot be read, the depth stays as it was. Only dispatch calls it (it
// reads a.cons).
func (a *Agent) probeDepth(ctx context.Context) {
	now := a.now()
	if now.Before(a.depth.next) {
		return
	}
	a.depth.next = now.Add(a.cfg.HeartbeatInterval.Std())
	lctx, cancel := a.loopRequest(ctx)
	defer cancel()
	// Bounded as consumerMissing's probe: an undrain is not seen by a
	// loop waiting on an unanswered request.
	ictx, icancel := context.WithTimeout(lctx, probeTimeout)
	defer icancel()
	info, err := a.cons.Info(ictx)
	if errors.Is(err, jetstream.ErrConsumerNotFound) && a.recreateConsumer(ctx) {
		// Held back longer than consumer_inactive_threshold, the agent
		// asked for nothing and the server removed its consumer: its
		// depth went stale. The consumer made again counts the tasks
		// still queued on its subject (the work queue kept them).
		info, err = a.cons.Info(ictx)
	}
	if err != nil {
		a.log.Debug().Err(err).Msg("queue depth: consumer info")
		return
	}
	a.stats.queueDepth.Store(int64(info.NumPending))
}

// takeSlot waits for a free slot and takes it; it reports false if ctx
// ended first. A drain or a lower limit that finds every slot busy holds
// the agent back there, for as long as its tasks run: on each tick it
// probes the queue depth meanwhile (probeDepth).
func (a *Agent) takeSlot(ctx context.Context, slots chan struct{}, tick <-chan time.Time) bool {
	for {
		select {
		case slots <- struct{}{}:
			return true
		case <-tick:
			if a.heldBack(slots) {
				a.probeDepth(ctx)
			}
		case <-ctx.Done():
			return false
		}
	}
}

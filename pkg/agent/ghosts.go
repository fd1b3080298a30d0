package agent

import (
	"context"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// ghostCheck finds deliveries the agent never received. A task delivered in
// answer to a pull request at the moment the server shut down is lost in
// transit, yet the server may keep counting it as delivered and unacked,
// and (seen with nats-server 2.15 after a restart) never redeliver it: the
// step would wait for its whole lease. The agent is the only consumer of
// its subject, so while it holds nothing, every unacked delivery of its
// consumer is such a ghost. Seen on two idle checks at least a lease
// apart, the consumer is deleted and created again, which delivers the
// ghosts' messages (still in the work-queue stream) afresh. A task the
// agent does hold but cannot finish (a result publish waiting for a lost
// PubAck, say, or an expiry report or a dead letter, before it runs) is
// not a ghost: the check stays quiet while anything is in flight, counted
// from the delivery's arrival (pull), and report.go bounds each publish
// instead.
type ghostCheck struct {
	next  time.Time // no check before then
	since time.Time // ghosts first seen (zero: none)
}

func (a *Agent) checkGhosts(ctx context.Context) {
	now := a.now()
	if now.Before(a.ghosts.next) || a.stats.inFlight.Load() != 0 {
		return
	}
	lease := a.cfg.Lease.Std()
	a.ghosts.next = now.Add(lease)
	ictx, cancel := a.loopRequest(ctx)
	defer cancel()
	info, err := a.cons.Info(ictx)
	if err != nil {
		a.log.Debug().Err(err).Msg("ghost check: consumer info")
	}
	if err != nil || info.NumAckPending == 0 || a.stats.inFlight.Load() != 0 {
		a.ghosts.since = time.Time{}
		return
	}
	if a.ghosts.since.IsZero() {
		a.log.Info().Int("unacked", info.NumAckPending).Msg("the task consumer counts deliveries this agent does not hold; checking again after a lease")
		a.ghosts.since = now
		return
	}
	if now.Sub(a.ghosts.since) < lease {
		return
	}
	a.log.Warn().Int("unacked", info.NumAckPending).Dur("for", now.Sub(a.ghosts.since)).
		Msg("the task consumer counts deliveries this agent never received (lost as the server restarted): re-creating it so they are delivered again")
	if err := a.js.DeleteConsumer(ictx, protocol.TaskStream(a.shard), info.Name); err != nil {
		a.log.Warn().Err(err).Msg("delete task consumer failed")
		return
	}
	a.ghosts.since = time.Time{}
	a.recreateConsumer(ctx)
}

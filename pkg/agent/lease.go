package agent

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// ackProgress is the JetStream "work in progress" ack: it restarts AckWait.
var ackProgress = []byte("+WPI")

// leaseKeeper extends a task's lease while its handler runs. It sends +WPI
// as a request, and believes an extension only when the server's ack reply
// arrived: a lost extension must not let us work on a task the server has
// already handed to someone else. If the believed lease runs out, onLost is
// called once.
type leaseKeeper struct {
	nc    *nats.Conn
	reply string        // the task message's ack subject
	lease time.Duration // the consumer's AckWait
	// until is the step's deadline: once the believed lease covers it,
	// extending further would only keep a dead task pending; zero: none.
	until  time.Time
	now    func() time.Time
	onLost func()
	log    zerolog.Logger

	mu       sync.Mutex
	believed time.Time // end of the lease we are sure of
}

func newLeaseKeeper(nc *nats.Conn, reply string, lease time.Duration, received, until time.Time,
	now func() time.Time, onLost func(), log zerolog.Logger) *leaseKeeper {
	return &leaseKeeper{
		nc: nc, reply: reply, lease: lease, until: until, now: now, onLost: onLost, log: log,
		// The server started AckWait when it sent the message, a little
		// before we received it: assume a tenth of the lease went by.
		believed: received.Add(lease - lease/10),
	}
}

// Believed is the end of the lease the keeper is sure of.
func (k *leaseKeeper) Believed() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.believed
}

// run extends the lease every lease/3 until ctx ends.
func (k *leaseKeeper) run(ctx context.Context) {
	every := k.lease / 3
	tick := time.NewTicker(every)
	defer tick.Stop()
	lost := time.NewTimer(k.Believed().Sub(k.now()))
	defer lost.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-lost.C:
			if left := k.Believed().Sub(k.now()); left > 0 {
				lost.Reset(left)
				continue
			}
			k.onLost()
			return
		case <-tick.C:
			believed := k.Believed()
			if !k.until.IsZero() && !believed.Before(k.until) {
				continue // the lease already covers the deadline
			}
			sent := k.now()
			wait := min(every, believed.Sub(sent))
			if wait <= 0 {
				continue // the lost timer fires next
			}
			rctx, cancel := context.WithTimeout(ctx, wait)
			_, err := k.nc.RequestWithContext(rctx, k.reply, ackProgress)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					k.log.Warn().Err(err).Time("lease_until", believed).Msg("lease extension not confirmed")
				}
				continue
			}
			k.mu.Lock()
			k.believed = sent.Add(k.lease)
			k.mu.Unlock()
			// Go 1.23+ timers: Reset drops a stale expiry, no drain needed.
			lost.Reset(k.Believed().Sub(k.now()))
		}
	}
}

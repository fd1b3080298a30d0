package scheduler

import (
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// holds counts, per partition, the messages this scheduler keeps
// unacknowledged for waiting jobs (waiter.held): for an agent or a slot,
// or behind a gate or a retry backoff.
// Bare submissions (on warden.submit, through the consumer all schedulers
// share, whose max_ack_pending no partition budget bounds) are never held.
// Every one of them counts against its partition consumer's
// max_ack_pending, and a consumer at its limit delivers nothing more: 4,096
// jobs waiting for a pool with no agents stalled every other job of their
// partition, whatever its pool. Past budget a waiting job's messages are
// acknowledged instead of held. The job's record already says what it
// waits for, so nothing is lost: this scheduler keeps waking it from
// memory, and if the scheduler goes, the supervisor's recovery asks for the
// pending step to be advanced (after recovery_grace), where a held message
// would have been redelivered after its ack wait.
type holds struct {
	count  []atomic.Int64
	budget int64
}

// newHolds allows each partition half of its consumer's max_ack_pending,
// which leaves the other half for the inputs moving through.
func newHolds(partitions int) (*holds, error) {
	c, err := streams.PartitionConsumer("submit", 0, "", 0, 0)
	if err != nil {
		return nil, err
	}
	return &holds{count: make([]atomic.Int64, partitions), budget: int64(max(c.MaxAckPending/2, 1))}, nil
}

// hold returns the messages of a waiting job to keep unacknowledged, and
// acknowledges the others: bare submissions, and all of them past the
// partition's budget.
func (h *holds) hold(job string, msgs []jetstream.Msg) []jetstream.Msg {
	keep := msgs[:0:0]
	for _, m := range msgs {
		if m.Subject() == protocol.SubjectSubmit {
			_ = m.Ack()
		} else {
			keep = append(keep, m)
		}
	}
	if len(keep) == 0 {
		return nil
	}
	c := &h.count[protocol.Partition(job, len(h.count))]
	if c.Add(int64(len(keep))) > h.budget {
		c.Add(-int64(len(keep)))
		for _, m := range keep {
			_ = m.Ack()
		}
		return nil
	}
	return keep
}

// give returns the room of n held messages of job (settled or handed back).
func (h *holds) give(job string, n int) {
	if n > 0 {
		h.count[protocol.Partition(job, len(h.count))].Add(-int64(n))
	}
}

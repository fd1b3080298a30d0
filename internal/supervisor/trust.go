package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// queue is an agent's own task queue, derived from its pool and id alone:
// the supervisor never takes a stream, subject or consumer name from a
// presence record or an advisory, so a forged one cannot point it at
// events, results, dead letters or another agent's tasks.
type queue struct {
	pool, agent string
	shard       int
	stream      string // WARDEN_TASKS_<shard>
	subject     string // warden.task.<shard>.<pool>.<agent>
	consumer    string // the agent id
}

// agentQueue derives the task queue of agent pool.agent; false if either
// is not a valid id.
func agentQueue(pool, agent string, shards int) (queue, bool) {
	if !protocol.ValidToken(pool) || !protocol.ValidToken(agent) {
		return queue{}, false
	}
	shard := protocol.Shard(pool, agent, shards)
	return queue{pool: pool, agent: agent, shard: shard, stream: protocol.TaskStream(shard),
		subject: protocol.TaskSubject(shard, pool, agent), consumer: agent}, true
}

// taskOwner returns the queue a task subject belongs to, if the subject is
// exactly the task subject its pool and agent derive.
func taskOwner(subject string, shards int) (queue, bool) {
	parts := strings.Split(subject, ".")
	if len(parts) != 5 || parts[0]+"."+parts[1] != protocol.SubjectTaskPrefix {
		return queue{}, false
	}
	q, ok := agentQueue(parts[3], parts[4], shards)
	if !ok || q.subject != subject {
		return queue{}, false
	}
	return q, true
}

// rejection is a hint (an advisory) that does not match what the server
// says; it changes nothing and is reported.
type rejection struct{ why string }

func (r *rejection) Error() string { return "rejected: " + r.why }

func reject(format string, args ...any) error { return &rejection{why: fmt.Sprintf(format, args...)} }

// errUnconfirmed: the advisory may be true but the consumer cannot show it
// yet (a delivery below the message is still in flight, so the ack floor
// has not passed it); check again later.
var errUnconfirmed = errors.New("max deliveries not confirmed yet")

// Re-checks of an unconfirmed advisory: after confirmRetry, doubling up to
// maxConfirmRetry, until the task's deadline (its step's lease end) has
// passed; then it is rejected, since the lease recovery takes the step back
// anyway (and counts it towards poison). A true advisory that is rejected
// loses nothing; one confirmed within the lease saves the step the wait.
// The bound was 30 s: in make chaos a poison step was parked a minute after
// its last crash (1+2+4+8+16+30 s of checks), long after the deliveries
// that held the check back had been acked. A check costs four small
// requests, so every 5 s is cheap.
const maxConfirmRetry = 5 * time.Second

// confirm checks a max-deliveries advisory against the server before
// anything is dead-lettered, and returns the task message (nil: already
// gone, nothing to do). The message must be on the named consumer's own
// task subject in its own stream, and the consumer must show that it gave
// up on it (see checkExhausted). The message is read again after the
// consumer's state: still there then, it was not acked (acking removes a
// work-queue message).
func (d *deadLetters) confirm(ctx context.Context, adv advisory) (*jetstream.RawStreamMsg, error) {
	if !strings.HasPrefix(adv.Stream, protocol.StreamTasksPrefix) {
		return nil, reject("stream %q is not a task stream", adv.Stream)
	}
	stream, err := d.js.Stream(ctx, adv.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, reject("no stream %q", adv.Stream)
	}
	if err != nil {
		return nil, err
	}
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil // already moved (failover) or acked after all
	}
	if err != nil {
		return nil, err
	}
	q, ok := taskOwner(raw.Subject, d.shards)
	if !ok || q.stream != adv.Stream || q.consumer != adv.Consumer {
		return nil, reject("message %d is on %s, not on consumer %q's own task subject", raw.Sequence, raw.Subject, adv.Consumer)
	}
	cons, err := stream.Consumer(ctx, q.consumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, reject("no consumer %q on %s", q.consumer, q.stream)
	}
	if err != nil {
		return nil, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkExhausted(info, q, adv, raw.Sequence); err != nil {
		if errors.Is(err, errUnconfirmed) && deadlinePassed(raw, d.term.now()) {
			return nil, reject("%v before the task's deadline %s: the step's lease recovery takes it back", err, raw.Header.Get(protocol.HeaderDeadline))
		}
		return nil, err
	}
	if _, err := stream.GetMsg(ctx, raw.Sequence); errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil // acked as we looked
	} else if err != nil {
		return nil, err
	}
	return raw, nil
}

// deadlinePassed reports whether the task's deadline (its step's lease
// end) is before now; a task without a readable one counts as passed.
func deadlinePassed(raw *jetstream.RawStreamMsg, now time.Time) bool {
	t, err := time.Parse(time.RFC3339Nano, raw.Header.Get(protocol.HeaderDeadline))
	return err != nil || now.After(t)
}

// confirmRetry is the delay before the n+1st check of an unconfirmed
// advisory: the recovery retry, doubling, at most maxConfirmRetry.
func confirmRetry(base time.Duration, n uint64) time.Duration {
	d := base
	for i := uint64(1); i < n && d < maxConfirmRetry; i++ {
		d *= 2
	}
	return min(d, maxConfirmRetry)
}

// checkExhausted compares the consumer's state with the advisory for the
// task message at stream sequence seq, which is still in its work-queue
// stream (so nobody acked it). The consumer gave up on it (max deliveries)
// if it was delivered and is no longer pending: below the consumer's ack
// floor nothing is pending (the server keeps that so), and with nothing
// pending at all nothing is. A message above the floor while deliveries
// are in flight may still be pending (awaiting redelivery): unconfirmed.
// NumAckPending as a whole says nothing about this message; the floor does.
func checkExhausted(info *jetstream.ConsumerInfo, q queue, adv advisory, seq uint64) error {
	c := info.Config
	if c.FilterSubject != q.subject && !slices.Equal(c.FilterSubjects, []string{q.subject}) {
		return reject("consumer %q does not filter its own task subject %s", q.consumer, q.subject)
	}
	if c.MaxDeliver <= 0 || adv.Deliveries < uint64(c.MaxDeliver) {
		return reject("%d deliveries claimed, the consumer's max_deliver is %d", adv.Deliveries, c.MaxDeliver)
	}
	if seq > info.Delivered.Stream {
		return reject("message %d was never delivered (consumer delivered up to %d)", seq, info.Delivered.Stream)
	}
	if info.NumRedelivered == 0 {
		return reject("the consumer has redelivered nothing")
	}
	if seq <= info.AckFloor.Stream || info.NumAckPending == 0 {
		return nil
	}
	return fmt.Errorf("%w: message %d is above consumer %q's ack floor %d with %d deliveries in flight",
		errUnconfirmed, seq, q.consumer, info.AckFloor.Stream, info.NumAckPending)
}

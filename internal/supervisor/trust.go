package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

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
// yet (it has deliveries in flight); try again later.
var errUnconfirmed = errors.New("max deliveries not confirmed yet")

// maxConfirmAttempts bounds how often an advisory is re-checked before it
// is rejected. A true advisory that is rejected loses nothing: the step's
// lease still expires and the lease recovery counts it towards poison.
const maxConfirmAttempts = 5

// confirm checks a max-deliveries advisory against the server before
// anything is dead-lettered, and returns the task message (nil: already
// gone, nothing to do). The message must be on the named consumer's own
// task subject in its own stream, and the consumer must show that it gave
// up on it: a max_deliver the advisory reaches, the message delivered,
// redelivery state kept, and nothing of its in flight (a message still in
// a work-queue stream, delivered, with no ack pending, was given up on).
func (d *deadLetters) confirm(ctx context.Context, adv advisory, msg jetstream.Msg) (*jetstream.RawStreamMsg, error) {
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
		if errors.Is(err, errUnconfirmed) {
			if md, merr := msg.Metadata(); merr == nil && md.NumDelivered >= maxConfirmAttempts {
				return nil, reject("%v after %d checks", err, md.NumDelivered)
			}
		}
		return nil, err
	}
	return raw, nil
}

// checkExhausted compares the consumer's state with the advisory.
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
	if info.NumAckPending > 0 {
		return fmt.Errorf("%w: %d deliveries of consumer %q in flight", errUnconfirmed, info.NumAckPending, q.consumer)
	}
	return nil
}

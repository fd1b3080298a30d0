package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/jobstore"
	"github.com/wardenhq/warden/pkg/logging"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// advisory is the part of a JetStream consumer advisory the leader reads.
type advisory struct {
	Type       string `json:"type"`
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
	Reason     string `json:"reason"`
}

const (
	advisoryMaxDeliver = "io.nats.jetstream.advisory.v1.max_deliver"
	advisoryTerminated = "io.nats.jetstream.advisory.v1.terminated"
)

// deadLetterLoop handles the task streams' advisories, which the
// WARDEN_ADVISORIES stream kept while no leader ran.
func (l *leader) deadLetterLoop(ctx context.Context) error {
	cfg, err := streams.SupervisorConsumer()
	if err != nil {
		return err
	}
	cons, err := l.js.CreateOrUpdateConsumer(ctx, protocol.StreamAdvisories, cfg)
	if err != nil {
		return fmt.Errorf("advisory consumer: %w", err)
	}
	for ctx.Err() == nil {
		if done := l.advisoryBatch(ctx, cons); done {
			return nil
		}
	}
	return nil
}

// advisoryBatch handles one fetch of advisories; true means stop leading.
func (l *leader) advisoryBatch(ctx context.Context, cons jetstream.Consumer) bool {
	fctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	batch, err := cons.Fetch(32, jetstream.FetchContext(fctx))
	if err != nil {
		if ctx.Err() == nil {
			l.log.Warn().Err(err).Msg("advisory fetch failed")
			sleepCtx(ctx, l.cfg.RecoveryRetry.Std())
		}
		return false
	}
	for msg := range batch.Messages() {
		err := l.handleAdvisory(ctx, msg)
		switch {
		case errors.Is(err, errNotLeader):
			_ = msg.Nak()
			return true
		case err != nil:
			l.log.Warn().Err(err).Msg("advisory handling failed; will retry")
			_ = msg.NakWithDelay(l.cfg.RecoveryRetry.Std())
		default:
			_ = msg.Ack()
		}
	}
	return false
}

func (l *leader) handleAdvisory(ctx context.Context, msg jetstream.Msg) error {
	var adv advisory
	if err := json.Unmarshal(msg.Data(), &adv); err != nil {
		l.log.Warn().Err(err).Msg("dropping undecodable advisory")
		return nil
	}
	if !strings.HasPrefix(adv.Stream, protocol.StreamTasksPrefix) {
		return nil
	}
	switch adv.Type {
	case advisoryTerminated:
		// A terminated work-queue message is gone; the agent copied it
		// to the dead-letter stream before terminating it.
		l.log.Warn().Str("stream", adv.Stream).Str("agent", adv.Consumer).Uint64("stream_seq", adv.StreamSeq).
			Str("reason", adv.Reason).Msg("task terminated by its agent")
		return nil
	case advisoryMaxDeliver:
	default:
		return nil
	}
	stream, err := l.js.Stream(ctx, adv.Stream)
	if err != nil {
		return err
	}
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // already moved (failover) or acked after all
	}
	if err != nil {
		return err
	}
	job, step := raw.Header.Get(protocol.HeaderJob), raw.Header.Get(protocol.HeaderStep)
	epoch, _ := strconv.ParseUint(raw.Header.Get(protocol.HeaderEpoch), 10, 64)
	detail := fmt.Sprintf("delivered %d times to agent %s without an ack", adv.Deliveries, adv.Consumer)
	for range 8 {
		st, rev, err := l.store.Step(ctx, job, step)
		if err != nil && !errors.Is(err, jobstore.ErrNotFound) {
			return err
		}
		if err != nil || st.Epoch != epoch || st.State.Terminal() {
			// The step moved on (or never existed): this copy of its task
			// is stale, and the DLQ holds only steps that need an operator.
			l.log.Info().Str(logging.FieldJob, job).Str(logging.FieldStep, step).Str("detail", detail).
				Msg("deleting a stale task that exhausted its deliveries")
			if err := stream.DeleteMsg(ctx, raw.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				return err
			}
			return nil
		}
		err = l.deadLetterStep(ctx, st, rev, "max_deliveries", detail, raw, adv.Deliveries)
		if errors.Is(err, jobstore.ErrConflict) {
			continue
		}
		if err != nil {
			return err
		}
		return l.dispatch.Advance(ctx, st.JobID)
	}
	return jobstore.ErrConflict
}

// deadLetterStep parks a step: a copy of its task (the original message if
// there is one, else one built from the record) goes to the dead-letter
// stream, the original is deleted, and the step is marked dead-lettered.
// deliveries is the task's delivery count when known (0 otherwise).
func (l *leader) deadLetterStep(ctx context.Context, st *jobstore.Step, rev uint64, reason, detail string,
	raw *jetstream.RawStreamMsg, deliveries uint64) error {
	if err := l.fence(); err != nil {
		return err
	}
	if err := l.copyToDLQ(ctx, st, raw, reason, detail, deliveries); err != nil {
		return err
	}
	st.DeadLetter(detail, l.now().UTC())
	if _, err := l.store.UpdateStep(ctx, st, rev); err != nil {
		return err
	}
	l.log.Warn().Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Str("reason", reason).Str("detail", detail).
		Msg("step dead-lettered")
	_ = l.events.Publish(ctx, protocol.Event{Kind: "dead_lettered", ID: st.JobID, JobID: st.JobID, StepID: st.ID,
		Agent: st.Actor, Reason: detail, Data: map[string]string{"reason": reason}})
	return nil
}

// copyToDLQ publishes the dead letter (waiting for the PubAck), then deletes
// the original task, in that order: a crash in between leaves a duplicate,
// never a loss.
func (l *leader) copyToDLQ(ctx context.Context, st *jobstore.Step, raw *jetstream.RawStreamMsg, reason, detail string, deliveries uint64) error {
	pool, agent, epoch := st.Pool, st.Actor, strconv.FormatUint(st.Epoch, 10)
	if agent == "" {
		agent = "none"
	}
	stream := ""
	msg := nats.NewMsg("")
	if raw != nil {
		// warden.task.<shard>.<pool>.<agent>: where the task was, and whose.
		if parts := strings.Split(raw.Subject, "."); len(parts) == 5 {
			pool, agent = parts[3], parts[4]
			if shard, err := strconv.Atoi(parts[2]); err == nil {
				stream = protocol.TaskStream(shard)
			}
		}
		for k, v := range raw.Header {
			if k != protocol.HeaderMsgID {
				msg.Header[k] = append([]string(nil), v...)
			}
		}
		msg.Data = raw.Data
		epoch = raw.Header.Get(protocol.HeaderEpoch)
		msg.Header.Set(protocol.HeaderDLQStream, stream)
		msg.Header.Set(protocol.HeaderDLQStreamSeq, strconv.FormatUint(raw.Sequence, 10))
	} else {
		task := protocol.Task{JobID: st.JobID, StepID: st.ID, Epoch: st.Epoch, Attempt: st.Attempt, Action: st.Action,
			Params: st.Params, Timeout: st.Timeout, Deadline: st.LockedUntil}
		msg.Data, _ = json.Marshal(task)
		msg.Header.Set(protocol.HeaderJob, st.JobID)
		msg.Header.Set(protocol.HeaderStep, st.ID)
		msg.Header.Set(protocol.HeaderEpoch, epoch)
		msg.Header.Set(protocol.HeaderAction, st.Action)
	}
	job, step := st.JobID, st.ID
	msg.Subject = protocol.DLQSubject(pool, agent)
	msg.Header.Set(protocol.HeaderMsgID, "dlq."+job+"."+step+"."+epoch+"."+reason)
	msg.Header.Set(protocol.HeaderDLQReason, reason)
	msg.Header.Set(protocol.HeaderDLQDetail, detail)
	msg.Header.Set(protocol.HeaderDLQDeliveries, strconv.FormatUint(deliveries, 10))
	msg.Header.Set(protocol.HeaderDLQTime, l.now().UTC().Format(time.RFC3339Nano))
	if st.LastError != "" {
		msg.Header.Set(protocol.HeaderDLQLastError, st.LastError)
	}
	if _, err := l.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("publish dead letter: %w", err)
	}
	l.metrics.deadLettered.WithLabelValues(reason).Inc()
	if raw != nil {
		s, err := l.js.Stream(ctx, stream)
		if err == nil {
			err = s.DeleteMsg(ctx, raw.Sequence)
		}
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("delete dead-lettered task: %w", err)
		}
	}
	return nil
}

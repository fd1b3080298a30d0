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
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/logging"
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

// deadLetters owns the dead-letter stream's input: it handles the task
// streams' max-deliveries advisories (kept by WARDEN_ADVISORIES while no
// leader runs) and parks steps there for an operator. An advisory is only
// a hint: before it parks anything it confirms, from the task message and
// its consumer, that the message really exhausted its deliveries (see
// confirm); an advisory it cannot confirm changes nothing and is reported.
type deadLetters struct {
	js      jetstream.JetStream
	term    *term
	store   *jobstore.Store
	adv     *advancer
	metrics *Metrics
	shards  int
	retry   time.Duration
	log     zerolog.Logger
}

// run handles advisories until ctx ends or the lease is lost.
func (d *deadLetters) run(ctx context.Context) error {
	cfg, err := streams.SupervisorConsumer()
	if err != nil {
		return err
	}
	cons, err := d.js.CreateOrUpdateConsumer(ctx, protocol.StreamAdvisories, cfg)
	if err != nil {
		return fmt.Errorf("advisory consumer: %w", err)
	}
	for ctx.Err() == nil {
		d.batch(ctx, cons)
	}
	return nil
}

// batch handles one fetch of advisories.
func (d *deadLetters) batch(ctx context.Context, cons jetstream.Consumer) {
	fctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	batch, err := cons.Fetch(32, jetstream.FetchContext(fctx))
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn().Err(err).Msg("advisory fetch failed")
			sleepCtx(ctx, d.retry)
		}
		return
	}
	for msg := range batch.Messages() {
		err := d.handle(ctx, msg)
		switch {
		case errors.Is(err, errNotLeader):
			// Handled again once the lease is sure (see recovery.due).
			_ = msg.NakWithDelay(d.retry)
		case errors.Is(err, errUnconfirmed):
			// Checked again later: a delivery below it is in flight.
			n := uint64(1)
			if md, merr := msg.Metadata(); merr == nil {
				n = md.NumDelivered
			}
			wait := confirmRetry(d.retry, n)
			d.log.Info().Err(err).Dur("check_again_in", wait).Msg("max deliveries not confirmed yet")
			_ = msg.NakWithDelay(wait)
		case err != nil:
			d.log.Warn().Err(err).Msg("advisory handling failed; will retry")
			_ = msg.NakWithDelay(d.retry)
		default:
			_ = msg.Ack()
		}
	}
}

func (d *deadLetters) handle(ctx context.Context, msg jetstream.Msg) error {
	var adv advisory
	if err := json.Unmarshal(msg.Data(), &adv); err != nil {
		return d.reject(ctx, adv, "undecodable advisory: "+err.Error())
	}
	switch adv.Type {
	case advisoryTerminated:
		// A terminated work-queue message is gone; the agent copied it
		// to the dead-letter stream before terminating it.
		d.log.Warn().Str("stream", adv.Stream).Str("agent", adv.Consumer).Uint64("stream_seq", adv.StreamSeq).
			Str("reason", adv.Reason).Msg("task terminated by its agent")
		return nil
	case advisoryMaxDeliver:
	default:
		return nil
	}
	raw, err := d.confirm(ctx, adv)
	var rej *rejection
	switch {
	case errors.As(err, &rej):
		return d.reject(ctx, adv, rej.why)
	case err != nil || raw == nil:
		return err
	}
	return d.exhausted(ctx, adv, raw)
}

// exhausted parks the step whose task exhausted its deliveries, or deletes
// the task if its step has moved on.
func (d *deadLetters) exhausted(ctx context.Context, adv advisory, raw *jetstream.RawStreamMsg) error {
	job, step := raw.Header.Get(protocol.HeaderJob), raw.Header.Get(protocol.HeaderStep)
	epoch, _ := strconv.ParseUint(raw.Header.Get(protocol.HeaderEpoch), 10, 64)
	detail := fmt.Sprintf("delivered %d times to agent %s without an ack", adv.Deliveries, adv.Consumer)
	for range maxConflicts {
		st, rev, err := d.store.Step(ctx, job, step)
		if err != nil && !errors.Is(err, jobstore.ErrNotFound) {
			return err
		}
		if err != nil || st.Epoch != epoch || st.State != jobstore.StepDispatched {
			// The step moved on (or never existed): this copy of its task
			// is stale, and the DLQ holds only steps that need an operator.
			// A step back to pending keeps its epoch until it is dispatched
			// again (a release, an operator's retry): parking it for its
			// old task's deliveries, as when only terminal steps counted as
			// moved on, dead-lettered a step just reopened.
			d.log.Info().Str(logging.FieldJob, job).Str(logging.FieldStep, step).Str("detail", detail).
				Msg("deleting a stale task that exhausted its deliveries")
			return d.deleteTask(ctx, adv.Stream, raw.Sequence)
		}
		err = d.park(ctx, st, rev, protocol.DLQMaxDeliveries, detail, raw, adv.Deliveries)
		if errors.Is(err, jobstore.ErrConflict) {
			continue
		}
		if err != nil {
			return err
		}
		d.adv.AdvanceOrRetry(ctx, st.JobID)
		return nil
	}
	return jobstore.ErrConflict
}

// park parks a step: a copy of its task (the original message if there is
// one, else one built from the record) goes to the dead-letter stream, the
// original is deleted, and the step is marked dead-lettered. deliveries is
// the task's delivery count when known (0 otherwise).
func (d *deadLetters) park(ctx context.Context, st *jobstore.Step, rev uint64, reason protocol.DLQReason, detail string,
	raw *jetstream.RawStreamMsg, deliveries uint64) error {
	if err := d.copyToDLQ(ctx, st, raw, reason, detail, deliveries); err != nil {
		return err
	}
	agent := st.Actor
	st.DeadLetter(detail, d.term.now().UTC())
	if _, err := d.term.updateStep(ctx, st, rev); err != nil {
		return err
	}
	d.log.Warn().Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Str("reason", string(reason)).Str("detail", detail).
		Msg("step dead-lettered")
	if err := d.term.event(ctx, protocol.Event{Kind: protocol.EventDeadLettered, ID: st.JobID, JobID: st.JobID, StepID: st.ID,
		Agent: agent, Reason: detail, Data: map[string]string{"reason": string(reason), "epoch": strconv.FormatUint(st.Epoch, 10)}}); err != nil {
		d.log.Warn().Err(err).Str(logging.FieldJob, st.JobID).Msg("dead_lettered event not published")
	}
	return nil
}

// copyToDLQ publishes the dead letter (waiting for the PubAck), then deletes
// the original task, in that order: a crash in between leaves a duplicate,
// never a loss. The original is deleted only from its agent's own task
// stream, derived from the agent's pool and id.
func (d *deadLetters) copyToDLQ(ctx context.Context, st *jobstore.Step, raw *jetstream.RawStreamMsg, reason protocol.DLQReason, detail string, deliveries uint64) error {
	msg, stream := d.letter(st, raw)
	msg.Header.Set(protocol.HeaderMsgID, "dlq."+st.JobID+"."+st.ID+"."+msg.Header.Get(protocol.HeaderEpoch)+"."+string(reason))
	msg.Header.Set(protocol.HeaderDLQReason, string(reason))
	msg.Header.Set(protocol.HeaderDLQDetail, detail)
	msg.Header.Set(protocol.HeaderDLQDeliveries, strconv.FormatUint(deliveries, 10))
	msg.Header.Set(protocol.HeaderDLQTime, d.term.now().UTC().Format(time.RFC3339Nano))
	if st.LastError != "" {
		msg.Header.Set(protocol.HeaderDLQLastError, st.LastError)
	}
	if err := d.term.publish(ctx, msg); err != nil {
		return fmt.Errorf("publish dead letter: %w", err)
	}
	d.metrics.deadLettered.WithLabelValues(string(reason)).Inc()
	if raw == nil || stream == "" {
		return nil
	}
	return d.deleteTask(ctx, stream, raw.Sequence)
}

// letter builds the dead letter of st: a copy of the task message raw if
// there is one (and the task stream it is in, if it is an agent's own task
// subject), else a task rebuilt from the record.
func (d *deadLetters) letter(st *jobstore.Step, raw *jetstream.RawStreamMsg) (*nats.Msg, string) {
	pool, agent := st.Pool, st.Actor
	if agent == "" {
		agent = "none"
	}
	msg := nats.NewMsg("")
	stream := ""
	if raw != nil {
		if owner, ok := taskOwner(raw.Subject, d.shards); ok {
			pool, agent, stream = owner.pool, owner.agent, owner.stream
		}
		for k, v := range raw.Header {
			if k != protocol.HeaderMsgID {
				msg.Header[k] = append([]string(nil), v...)
			}
		}
		msg.Data = raw.Data
		msg.Header.Set(protocol.HeaderDLQStream, stream)
		msg.Header.Set(protocol.HeaderDLQStreamSeq, strconv.FormatUint(raw.Sequence, 10))
	} else {
		task := protocol.Task{JobID: st.JobID, StepID: st.ID, Epoch: st.Epoch, Attempt: st.Attempt, Action: st.Action,
			Params: st.Params, Timeout: st.Timeout, Deadline: st.LockedUntil}
		msg.Data, _ = json.Marshal(task)
		msg.Header.Set(protocol.HeaderJob, st.JobID)
		msg.Header.Set(protocol.HeaderStep, st.ID)
		msg.Header.Set(protocol.HeaderEpoch, strconv.FormatUint(st.Epoch, 10))
		msg.Header.Set(protocol.HeaderAction, st.Action)
	}
	msg.Subject = protocol.DLQSubject(pool, agent)
	return msg, stream
}

// deleteTask deletes a task message from a task stream (never any other).
func (d *deadLetters) deleteTask(ctx context.Context, stream string, seq uint64) error {
	if !strings.HasPrefix(stream, protocol.StreamTasksPrefix) {
		return fmt.Errorf("refusing to delete message %d from %s: not a task stream", seq, stream)
	}
	s, err := d.js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("task stream %s: %w", stream, err)
	}
	return d.term.deleteMsg(ctx, s, seq)
}

// reject reports an advisory that changes nothing.
func (d *deadLetters) reject(ctx context.Context, adv advisory, why string) error {
	d.log.Warn().Str("stream", adv.Stream).Str("consumer", adv.Consumer).Uint64("stream_seq", adv.StreamSeq).
		Uint64("deliveries", adv.Deliveries).Str("why", why).Msg("advisory rejected: nothing dead-lettered")
	id := adv.Consumer
	if !protocol.ValidToken(id) {
		id = "unknown"
	}
	return d.term.event(ctx, protocol.Event{Kind: protocol.EventAdvisoryRejected, ID: id, Agent: adv.Consumer, Reason: why,
		Data: map[string]string{"type": adv.Type, "stream": adv.Stream, "stream_seq": strconv.FormatUint(adv.StreamSeq, 10),
			"deliveries": strconv.FormatUint(adv.Deliveries, 10)}})
}

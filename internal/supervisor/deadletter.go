package supervisor

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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

// exhausted parks the step whose task exhausted its deliveries (or, if its
// job is being cancelled, ends it cancelled: cancel wins, as in a release),
// or deletes the task if its step has moved on.
func (d *deadLetters) exhausted(ctx context.Context, adv advisory, raw *jetstream.RawStreamMsg) error {
	job, step := raw.Header.Get(protocol.HeaderJob), raw.Header.Get(protocol.HeaderStep)
	epoch, _ := strconv.ParseUint(raw.Header.Get(protocol.HeaderEpoch), 10, 64)
	detail := fmt.Sprintf("delivered %d times to agent %s without an ack", adv.Deliveries, adv.Consumer)
	var sent parkedLetters
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
			if err != nil {
				st = nil
			}
			d.withdraw(ctx, sent, st, parkedLetter{}) // a park of this loop lost its CAS to the move
			return d.deleteTask(ctx, adv.Stream, raw.Sequence)
		}
		cw, err := cancelWanted(ctx, d.store, st)
		if err != nil {
			return err
		}
		var l parkedLetter
		if cw {
			// Cancel wins, as in a release: the step ends cancelled, and
			// no operator is asked to look at a job nobody wants any more.
			err = endCancelled(ctx, d.term, d.log, st, rev, "its task was "+detail)
		} else {
			l, err = d.park(ctx, st, rev, protocol.DLQMaxDeliveries, detail, raw, adv.Deliveries)
			sent.add(l)
		}
		if errors.Is(err, jobstore.ErrConflict) {
			continue
		}
		if err != nil {
			return err
		}
		d.withdraw(ctx, sent, st, l) // parks of this loop that lost their CAS
		d.adv.AdvanceOrRetry(ctx, st.JobID)
		// Deleted only now that the step's write landed: a write that
		// failed is retried with the advisory, which needs the task, and a
		// delete that fails has the advisory handled again, which finds
		// the step moved on and deletes it.
		return d.deleteTask(ctx, adv.Stream, raw.Sequence)
	}
	// Given up for now, not for good: the advisory is handled again, and
	// a park then relies on the letters stored here (its publish is
	// deduplicated to them), so they stay.
	return jobstore.ErrConflict
}

// park parks a step: a copy of its task (the original message if there is
// one, else one built from the record) goes to the dead-letter stream, and
// the step is marked dead-lettered. deliveries is the task's delivery count
// when known (0 otherwise).
//
// park leaves the original task where it is: its caller deletes it once the
// park has landed (exhausted, a release, a transfer's give-up). A park whose CAS or
// fence failed is tried again, and its retry needs the task (an advisory
// is confirmed from it, a failover and a transfer's judgement read the
// queue for it): deleted before the CAS, as it was, the retry found it
// gone, took that for "acked", and the step stayed dispatched, its poison
// sent again after its lease.
//
// It returns the letter it stored (none: sequence 0), also when marking the
// step fails: a letter stored for a park
// that lost its CAS stays there until the caller knows what became of the
// step. A caller that gives the park up because the step moved on
// withdraws it (see parkedLetters); one that parks again relies on it.
func (d *deadLetters) park(ctx context.Context, st *jobstore.Step, rev uint64, reason protocol.DLQReason, detail string,
	raw *jetstream.RawStreamMsg, deliveries uint64) (parkedLetter, error) {
	l, err := d.copyToDLQ(ctx, st, raw, reason, detail, deliveries)
	if err != nil {
		return l, err
	}
	agent := st.Actor
	st.DeadLetter(detail, d.term.now().UTC())
	if _, err := d.term.updateStep(ctx, st, rev); err != nil {
		return l, err
	}
	d.metrics.deadLettered.WithLabelValues(string(reason)).Inc()
	d.log.Warn().Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Str("reason", string(reason)).Str("detail", detail).
		Msg("step dead-lettered")
	d.term.note(ctx, d.log, protocol.Event{Kind: protocol.EventDeadLettered, ID: st.JobID, JobID: st.JobID, StepID: st.ID,
		Agent: agent, Reason: detail, Data: map[string]string{"reason": string(reason), "epoch": strconv.FormatUint(st.Epoch, 10)}})
	return l, nil
}

// copyToDLQ stores the dead letter (see send) and returns it. It deletes
// nothing: a crash or a lost CAS before the step is marked leaves a letter
// too many (see parkedLetters), never a lost task.
func (d *deadLetters) copyToDLQ(ctx context.Context, st *jobstore.Step, raw *jetstream.RawStreamMsg, reason protocol.DLQReason,
	detail string, deliveries uint64) (parkedLetter, error) {
	msg := d.letter(st, raw)
	msg.Header.Set(protocol.HeaderMsgID, "dlq."+st.JobID+"."+st.ID+"."+msg.Header.Get(protocol.HeaderEpoch)+"."+string(reason))
	msg.Header.Set(protocol.HeaderDLQReason, string(reason))
	msg.Header.Set(protocol.HeaderDLQDetail, detail)
	msg.Header.Set(protocol.HeaderDLQDeliveries, strconv.FormatUint(deliveries, 10))
	msg.Header.Set(protocol.HeaderDLQTime, d.term.now().UTC().Format(time.RFC3339Nano))
	if st.LastError != "" {
		msg.Header.Set(protocol.HeaderDLQLastError, st.LastError)
	}
	seq, err := d.send(ctx, msg, raw != nil)
	if err != nil {
		return parkedLetter{}, err
	}
	epoch, _ := strconv.ParseUint(msg.Header.Get(protocol.HeaderEpoch), 10, 64)
	return parkedLetter{seq: seq, epoch: epoch}, nil
}

// send publishes the dead letter msg (waiting for the PubAck) and returns
// its sequence in the dead-letter stream once it is stored there. copied
// says msg copies a task message, body included (else its task was rebuilt
// from the record, whose lease times may differ between two parks).
//
// The stream deduplicates by Nats-Msg-Id across all its subjects, and an
// agent may publish on its own dead-letter subject with any id: one that
// took this letter's id first (it knows the job, step and epoch of the
// tasks it saw) would have the letter dropped as a duplicate, and the task
// deleted after it, the letter lost. So a duplicate counts as stored only
// if the message it repeats is this letter (see sameLetter): a park
// retried after a lost CAS, or after an error, repeats its own letter. If
// not, and the last letter on msg's subject is not this one either (stored
// by an earlier park that met the same squatter), msg is published again
// under an id with a random part, which no agent can take first.
func (d *deadLetters) send(ctx context.Context, msg *nats.Msg, copied bool) (uint64, error) {
	ack, err := d.term.publish(ctx, msg)
	if err != nil {
		return 0, fmt.Errorf("publish dead letter: %w", err)
	}
	if !ack.Duplicate {
		return ack.Sequence, nil
	}
	s, err := d.js.Stream(ctx, protocol.StreamDLQ)
	if err != nil {
		return 0, fmt.Errorf("dead-letter stream: %w", err)
	}
	if ack.Sequence != 0 {
		stored, err := s.GetMsg(ctx, ack.Sequence)
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, fmt.Errorf("read the dead letter %d this one repeats: %w", ack.Sequence, err)
		}
		if err == nil && sameLetter(stored, msg, copied) {
			return ack.Sequence, nil
		}
	}
	last, err := s.GetLastMsgForSubject(ctx, msg.Subject)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, fmt.Errorf("read the last dead letter on %s: %w", msg.Subject, err)
	}
	if err == nil && sameLetter(last, msg, copied) {
		return last.Sequence, nil
	}
	id := msg.Header.Get(protocol.HeaderMsgID)
	d.log.Warn().Str(logging.FieldJob, msg.Header.Get(protocol.HeaderJob)).Str(logging.FieldStep, msg.Header.Get(protocol.HeaderStep)).
		Str("msg_id", id).Uint64("taken_by", ack.Sequence).
		Msg("the dead letter's message id was taken by a message that is not this letter; storing it under a fresh id")
	msg.Header.Set(protocol.HeaderMsgID, id+"."+rand.Text())
	if ack, err = d.term.publish(ctx, msg); err != nil {
		return 0, fmt.Errorf("publish dead letter: %w", err)
	}
	return ack.Sequence, nil
}

// letterVaries are the dead-letter headers that two parks of one step may
// set differently (the detail names a count or a time, the last error may
// have changed); a stored letter must carry the first three.
var letterVaries = []string{protocol.HeaderDLQDetail, protocol.HeaderDLQDeliveries, protocol.HeaderDLQTime, protocol.HeaderDLQLastError}

// sameLetter reports whether the stored message is the dead letter msg,
// stored by an earlier park: on msg's subject (an agent publishes only on
// its own), with every header of msg (the task's, job, step and epoch
// included, and the reason, stream and sequence it was moved for) but the
// message id and the ones that vary, and those present; copied, with the
// task's body too.
func sameLetter(stored *jetstream.RawStreamMsg, msg *nats.Msg, copied bool) bool {
	if stored.Subject != msg.Subject || (copied && !bytes.Equal(stored.Data, msg.Data)) {
		return false
	}
	for k, v := range msg.Header {
		if k != protocol.HeaderMsgID && !slices.Contains(letterVaries, k) && !slices.Equal(stored.Header.Values(k), v) {
			return false
		}
	}
	for _, k := range letterVaries[:3] {
		if stored.Header.Get(k) == "" {
			return false
		}
	}
	return true
}

// parkedLetter is a dead letter a park stored: its sequence in the
// dead-letter stream and the epoch it names (of the task it copies, else of
// the step); a zero one is none.
type parkedLetter struct{ seq, epoch uint64 }

// parkedLetters are the dead letters one park loop (a park retried after each
// lost CAS) stored. A park stores its letter before the CAS that marks its
// step, and the order stays (a crash in between leaves a letter too many,
// never a lost task); when the CAS is lost and the step turns out to have
// moved on (succeeded, released, cancelled, gone), the loop gives the park
// up and withdraws its letters, which would otherwise sit in the
// dead-letter stream for a step that needs no operator.
type parkedLetters []parkedLetter

func (ls *parkedLetters) add(l parkedLetter) {
	if l.seq != 0 && !slices.Contains(*ls, l) {
		*ls = append(*ls, l)
	}
}

// withdraw deletes from the dead-letter stream the letters of sent that no
// park relies on, st being the step as last read (nil: gone). kept is the
// letter of the loop's park that succeeded: that one stays, and the others
// go (an earlier epoch's). With none (kept zero), the loop gave up and every
// letter goes, unless st is dead-lettered at its epoch: another park of the
// same dispatch won the CAS, and its publish may have been deduplicated to
// this very letter. A park retried later, after its loop returned an error
// (not given up), relies on the letters kept then, so withdraw is for
// giving up only. Failures are logged: the letter stays, as before.
func (d *deadLetters) withdraw(ctx context.Context, sent parkedLetters, st *jobstore.Step, kept parkedLetter) {
	var s jetstream.Stream
	for _, l := range sent {
		if l.seq == kept.seq || (kept.seq == 0 && st != nil && st.State == jobstore.StepDeadLettered && st.Epoch == l.epoch) {
			continue
		}
		var err error
		if s == nil {
			s, err = d.js.Stream(ctx, protocol.StreamDLQ)
		}
		if err == nil {
			err = d.term.deleteMsg(ctx, s, l.seq)
		}
		ev := d.log.Info()
		if err != nil {
			ev = d.log.Warn().Err(err)
		}
		if st != nil {
			ev = ev.Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Str("state", string(st.State))
		}
		ev.Uint64("dlq_seq", l.seq).Uint64("epoch", l.epoch).Bool("withdrawn", err == nil).
			Msg("dead letter no park relies on withdrawn: its park lost its CAS and the step moved on")
	}
}

// letter builds the dead letter of st: a copy of the task message raw if
// there is one (naming the task stream it is in, if it is an agent's own
// task subject), else a task rebuilt from the record.
func (d *deadLetters) letter(st *jobstore.Step, raw *jetstream.RawStreamMsg) *nats.Msg {
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
	return msg
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

// dropTask deletes raw, the task of a step that moved on (parked, ended,
// moved again), from the queue its subject names (nil: none). A failure is
// logged: the old epoch's task may still run there, and its result is
// stale.
func (d *deadLetters) dropTask(ctx context.Context, raw *jetstream.RawStreamMsg) {
	if raw == nil {
		return
	}
	q, ok := taskOwner(raw.Subject, d.shards)
	if !ok {
		return
	}
	if err := d.deleteTask(ctx, q.stream, raw.Sequence); err != nil {
		d.log.Warn().Err(err).Str(logging.FieldJob, raw.Header.Get(protocol.HeaderJob)).Uint64("task_seq", raw.Sequence).
			Msg("task of a step that moved on not deleted from its queue")
	}
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

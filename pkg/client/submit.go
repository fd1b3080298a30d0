package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// SubmitOptions tune one submission.
type SubmitOptions struct {
	// ReplyTimeout overrides Options.ReplyTimeout for this call.
	ReplyTimeout time.Duration
	// NoReply skips waiting for the scheduler's reply: the PubAck alone is
	// the acceptance, and Receipt.Confirmed is false.
	NoReply bool
}

// Receipt is what Submit learned about an accepted submission.
type Receipt struct {
	JobID string `json:"job_id"`
	// Name is the job's name from the spec.
	Name string `json:"name"`
	// Existing is true when the job already existed: the server dropped the
	// publish as a duplicate of the same idempotency key, or the scheduler
	// found the job already materialised.
	Existing bool `json:"existing"`
	// Confirmed is true when the scheduler replied that it took the job.
	// False means only the server's PubAck is known (the reply timed out or
	// was not asked for); the job is durably accepted all the same and a
	// scheduler will materialise it when one runs.
	Confirmed bool `json:"confirmed"`
	// Stream and Sequence locate the submission in WARDEN_SUBMIT.
	Stream   string `json:"stream"`
	Sequence uint64 `json:"sequence"`
	// StartsAt, for a job with run_at or delay, is when it is due: the
	// scheduler holds it until then (Confirmed says it took it).
	StartsAt time.Time `json:"starts_at,omitzero"`
}

// Submit validates a job spec (YAML or JSON), publishes it to the submit
// subject and waits, bounded, for the scheduler's verdict.
//
// Errors: a *spec.ValidationError (errors.Is spec.ErrInvalid) when the spec
// is invalid, in which case nothing was published; a *RejectedError when the
// scheduler refused it; ErrNoSubmitStream or a NATS error when the server
// did not accept it; an *OutcomeUnknownError (errors.Is ErrOutcomeUnknown),
// with the Receipt's JobID set, when the server did not say whether it
// stored it. A scheduler that does not answer in time is not an error: the
// Receipt says Confirmed false; ctx ending during that wait is, with the
// Receipt of the accepted job.
func (c *Client) Submit(ctx context.Context, specBytes []byte, o SubmitOptions) (Receipt, error) {
	job, err := spec.Parse(specBytes, c.opts.Limits)
	if err != nil {
		return Receipt{}, err
	}
	r := Receipt{Name: job.Name, JobID: protocol.NewJobID()}
	msgID := r.JobID
	if job.IdempotencyKey != "" {
		// Every submitter derives the same id from the key, so the
		// scheduler and any resubmission agree on it.
		r.JobID = protocol.JobIDForKey(job.IdempotencyKey)
		msgID = job.IdempotencyKey
	}

	msg := nats.NewMsg(protocol.SubmitSubject(r.JobID))
	msg.Data = specBytes
	msg.Header.Set(protocol.HeaderJobID, r.JobID)
	msg.Header.Set(protocol.HeaderMsgID, msgID)

	// A job that starts later (run_at, delay) is submitted as any other:
	// the scheduler holds it in WARDEN_DELAY until it is due and confirms
	// that. Publishers do not write WARDEN_DELAY themselves: a stream with
	// message schedules must allow roll-ups (docs/security.md).
	if start := job.StartAt(time.Now()); start.After(time.Now()) {
		r.StartsAt = start
	}

	// Subscribe before publishing: the scheduler may answer before
	// PublishMsg returns, and a reply to an inbox nobody listens on is lost.
	// A scheduler answers only on _INBOX. subjects
	// (protocol.ValidReplySubject): a connection with another inbox prefix
	// gets the PubAck's receipt, unconfirmed, rather than a wait for an
	// answer that never comes.
	var sub *nats.Subscription
	if inbox := c.nc.NewRespInbox(); !o.NoReply && protocol.ValidReplySubject(inbox) {
		sub, err = c.nc.SubscribeSync(inbox)
		if err != nil {
			return Receipt{}, fmt.Errorf("subscribe to reply inbox: %w", err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		msg.Header.Set(protocol.HeaderReplyTo, inbox)
	}

	ack, err := c.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(protocol.StreamSubmit))
	if err != nil {
		if errors.Is(err, jetstream.ErrNoStreamResponse) {
			return Receipt{}, fmt.Errorf("submit job %s: %w (has a scheduler or `warden dev` created the streams?)", r.JobID, ErrNoSubmitStream)
		}
		if notStored(err) {
			return Receipt{}, fmt.Errorf("submit job %s: %w", r.JobID, err)
		}
		// The message may have been stored and only its PubAck lost: the
		// caller gets the job id to look for, not a bare error (a retry
		// of a spec without a key would be a second job).
		return r, &OutcomeUnknownError{JobID: r.JobID, Err: err}
	}
	r.Stream, r.Sequence = ack.Stream, ack.Sequence
	if ack.Duplicate {
		// The stream dropped the message: the scheduler will never see it
		// and so will never reply. The first submission is the job, unless
		// the scheduler rejected it.
		r.Existing = true
		return r, c.duplicateOf(ctx, r.JobID, ack.Sequence)
	}
	if sub == nil {
		return r, nil
	}

	timeout := o.ReplyTimeout
	if timeout <= 0 {
		timeout = c.opts.ReplyTimeout
	}
	if dl, ok := ctx.Deadline(); ok {
		// The job is accepted: the wait for its confirmation ends in time to
		// return the receipt before the caller's deadline. It used to run
		// into it and report an accepted job as an error (an API with a
		// request_timeout under the reply timeout answered 504, and a
		// retry without a key ran the job twice).
		timeout = min(timeout, max(time.Until(dl)-replyMargin, 0))
	}
	reply, ok, err := waitReply(ctx, sub, timeout)
	if err != nil {
		// The job is durably accepted; the caller stopped waiting for its
		// confirmation. The receipt says which job it is.
		return r, fmt.Errorf("job %s accepted (%s sequence %d), not confirmed: %w", r.JobID, r.Stream, r.Sequence, err)
	}
	if !ok {
		return r, nil // accepted; only the confirmation is missing
	}
	if reply.JobID != "" {
		r.JobID = reply.JobID
	}
	if reply.Error != "" {
		return r, &RejectedError{JobID: r.JobID, Reason: reply.Error}
	}
	r.Existing = r.Existing || reply.Existing
	r.Confirmed = true
	return r, nil
}

// notStored reports whether a failed publish certainly stored nothing: the
// server answered with an error, or the client refused to send it. Any
// other failure (a timeout, a connection lost, the context ended) leaves
// the outcome unknown.
func notStored(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) || errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) ||
		errors.Is(err, nats.ErrHeadersNotSupported) || errors.Is(err, nats.ErrInvalidMsg) || errors.Is(err, nats.ErrNoResponders)
}

// replyMargin is what Submit leaves of the caller's deadline to return.
const replyMargin = 250 * time.Millisecond

// waitReply waits up to timeout for a SubmitReply. ok is false when none
// came in time; err is set only when the caller's ctx ended, since that is a
// decision of the caller, not a property of the submission.
func waitReply(ctx context.Context, sub *nats.Subscription, timeout time.Duration) (protocol.SubmitReply, bool, error) {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		m, err := sub.NextMsgWithContext(wctx)
		if err != nil {
			if ctx.Err() != nil {
				return protocol.SubmitReply{}, false, fmt.Errorf("waiting for the scheduler's reply: %w", ctx.Err())
			}
			return protocol.SubmitReply{}, false, nil
		}
		var rep protocol.SubmitReply
		if err := json.Unmarshal(m.Data, &rep); err != nil {
			// Not a SubmitReply (someone else wrote to our inbox); keep
			// waiting for the real one.
			continue
		}
		return rep, true, nil
	}
}

// duplicateOf checks the submission (stream sequence seq) that a duplicate
// of job repeats. Within the stream's 2-minute duplicate window a repeat
// of a rejected submission was dropped all the same and reported as the
// existing job: no job existed, and `warden submit --wait` followed it for
// ever. That submission is still queued for a scheduler, or moved on: held
// on warden.delay in WARDEN_DELAY until it is due, released onto
// warden.delayed, submitted again on warden.submit (findHeld), or the
// scheduler took it, wrote the job record and only then acked it. If it is
// in none of these places, in that order, it was rejected. A caller that
// may not read the streams or the job store (the publisher role) gets the
// old answer.
func (c *Client) duplicateOf(ctx context.Context, job string, seq uint64) error {
	s, err := c.js.Stream(ctx, protocol.StreamSubmit)
	if err != nil {
		return nil
	}
	if _, err := s.GetMsg(ctx, seq); !errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // still queued, or no answer (no permission)
	}
	if h, err := c.findHeld(ctx, job); err != nil || h != nil {
		return nil // on its way to a record, or no answer
	}
	st, err := c.store(ctx)
	if err != nil {
		return nil
	}
	if _, _, err := st.Job(ctx, job); !errors.Is(err, jobstore.ErrNotFound) {
		return nil
	}
	return &RejectedError{JobID: job, Reason: "an earlier submission with this id or idempotency key was rejected, " +
		"and the server drops repeats of it for its 2-minute duplicate window: resubmit after it, or with another key"}
}

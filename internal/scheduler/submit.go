package scheduler

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// Reasons a submission is rejected beyond the spec's own (spec.Reason*).
const (
	reasonIDMismatch = "id_mismatch"
)

// submissionJobID derives a submission's job id without parsing the body
// when it can: the subject's job token (warden.submit.<p>.<job>), the
// Warden-Job-Id header, the idempotency key (Nats-Msg-Id), the spec's
// idempotency_key, and last the stream sequence and storage time, which
// are the same on every redelivery. A conflict between the ways, and an
// id from the subject or the header that is not a valid token, are left
// for parseSubmission to reject: the id is returned as it came.
func submissionJobID(msg jetstream.Msg, limits spec.Limits) string {
	if tok := strings.Split(msg.Subject(), "."); len(tok) == 4 {
		return tok[3]
	}
	h := msg.Headers()
	if id := h.Get(protocol.HeaderJobID); id != "" {
		return id
	}
	if key := h.Get(protocol.HeaderMsgID); key != "" {
		return protocol.JobIDForKey(key)
	}
	if sp, err := spec.Parse(msg.Data(), limits); err == nil && sp.IdempotencyKey != "" {
		return protocol.JobIDForKey(sp.IdempotencyKey)
	}
	md, err := msg.Metadata()
	if err != nil {
		return protocol.NewJobID()
	}
	return protocol.JobIDForKey(strconv.FormatUint(md.Sequence.Stream, 10) + "@" + md.Timestamp.String())
}

// idField names where a submission's job id came from, for a refusal.
func idField(msg jetstream.Msg) string {
	if strings.Count(msg.Subject(), ".") == 3 {
		return "subject"
	}
	return protocol.HeaderJobID
}

// parseSubmission parses and checks a submission: the spec itself, and
// that every way it names its job agrees (subject, header, idempotency key).
func (s *Scheduler) parseSubmission(in *input) (*spec.Job, error) {
	if !protocol.ValidToken(in.job) {
		return nil, &spec.ValidationError{Reason: spec.ReasonInvalidID, Field: idField(in.msg),
			Msg: fmt.Sprintf("job id %q may contain only letters, digits, '_' and '-' (at most %d)", clipID(in.job), protocol.MaxTokenLen)}
	}
	if in.parsed != nil {
		return in.parsed, nil // parsed and checked already (on arrival, priority.go)
	}
	sp, err := spec.Parse(in.msg.Data(), s.cfg.limitsFor(in.msg.Headers()))
	if err != nil {
		return nil, err
	}
	h := in.msg.Headers()
	if hid := h.Get(protocol.HeaderJobID); hid != "" && hid != in.job {
		return nil, &spec.ValidationError{Reason: reasonIDMismatch, Field: protocol.HeaderJobID,
			Msg: fmt.Sprintf("header names job %q but the subject names %q", hid, in.job)}
	}
	if sp.IdempotencyKey != "" {
		if want := protocol.JobIDForKey(sp.IdempotencyKey); want != in.job {
			return nil, &spec.ValidationError{Reason: reasonIDMismatch, Field: "idempotency_key",
				Msg: fmt.Sprintf("idempotency_key %q makes job id %s, but the submission names %s", sp.IdempotencyKey, want, in.job)}
		}
	}
	in.parsed = sp
	return sp, nil
}

// rejectSubmission records a refused submission as an event, tells the
// submitter, and terminates the message: it can never succeed.
func (s *Scheduler) rejectSubmission(jt *jobTurn, k int, err error) {
	in := jt.inputs[k]
	reason := spec.ReasonOf(err)
	if reason == "" {
		reason = spec.ReasonMalformed
	}
	jt.count(noWrite, Metrics.SubmissionRejected, reason)
	s.log.Warn().Str(logging.FieldJob, in.job).Str("reason", reason).Err(err).Msg("submission rejected")
	// An event's id is a subject token: a job id that is not one is filed
	// under the placeholder "invalid" (for the event only: the id never
	// becomes a job's), the id as submitted in data.submitted_id and the
	// reply.
	id := in.job
	if !protocol.ValidToken(id) {
		id = "invalid"
	}
	ev := protocol.Event{Kind: protocol.EventSubmissionRejected, ID: id, JobID: id, Reason: err.Error(),
		Data: map[string]string{"reason": reason, "subject": in.msg.Subject()}}
	if id != in.job {
		ev.Data["submitted_id"] = clipID(in.job)
	}
	if md, merr := in.msg.Metadata(); merr == nil {
		ev.Data["stream_seq"] = strconv.FormatUint(md.Sequence.Stream, 10)
	}
	jt.events = append(jt.events, outEvent{Event: ev, dedup: ev.Data["stream_seq"], write: noWrite})
	s.replyTo(jt, in, protocol.SubmitReply{JobID: clipID(in.job), Error: err.Error()})
	jt.settle[k].term = "rejected: " + reason
}

// clipID bounds an id that is not a token (a header may be kilobytes
// long) where it is quoted back.
func clipID(id string) string { return jobstore.Clip(id, 2*protocol.MaxTokenLen) }

// acceptSubmission answers a submission whose job exists now.
func (s *Scheduler) acceptSubmission(jt *jobTurn, k int, created bool) {
	in := jt.inputs[k]
	if created {
		jt.count(-1, countJobAccepted, "")
		s.log.Info().Str(logging.FieldJob, in.job).Str("name", jt.js.job.Name).Int("steps", len(jt.js.steps)).Msg("job accepted")
	}
	s.replyTo(jt, in, protocol.SubmitReply{JobID: in.job, Existing: !created})
}

// replyTo queues a reply to a submitter that asked for one (best effort:
// the PubAck already told it the job was accepted).
func (s *Scheduler) replyTo(jt *jobTurn, in input, r protocol.SubmitReply) {
	to := in.msg.Headers().Get(protocol.HeaderReplyTo)
	if to == "" {
		return
	}
	if !protocol.ValidReplySubject(to) {
		// The submitter chose the subject and the scheduler would publish
		// there with its own permissions (the job store, task subjects).
		s.log.Warn().Str(logging.FieldJob, in.job).Str("reply_to", to).
			Msg("submission's Warden-Reply-To is not an inbox: not answered")
		return
	}
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	jt.replies = append(jt.replies, reply{to: to, body: b})
}

package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/jobstore"
	"github.com/wardenhq/warden/pkg/logging"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// handleSubmission materialises a job from a submission. It is idempotent:
// a redelivered or repeated submission finds the records it (or another
// scheduler) already wrote and only completes what is missing.
func (s *Scheduler) handleSubmission(ctx context.Context, msg jetstream.Msg) {
	jobID := s.jobIDOf(msg)
	log := s.log.With().Str(logging.FieldJob, jobID).Logger()

	sp, err := spec.Parse(msg.Data(), s.cfg.limits())
	if err == nil && jobID == "" {
		err = &spec.ValidationError{Reason: spec.ReasonInvalidID, Field: protocol.HeaderJobID,
			Msg: fmt.Sprintf("%q may contain only letters, digits, '_' and '-'", msg.Headers().Get(protocol.HeaderJobID))}
	}
	if err != nil {
		s.reject(ctx, msg, jobID, err, log)
		return
	}

	existing := false
	job := jobstore.NewJob(jobID, *sp, s.now().UTC())
	if _, err := s.store.CreateJob(ctx, job); err != nil {
		if !errors.Is(err, jobstore.ErrExists) {
			s.settle(msg, err, log)
			return
		}
		// The same idempotency key, or a redelivery after a crash: continue
		// from the stored job (its own spec, not this submission's).
		existing = true
		job, _, err = s.store.Job(ctx, jobID)
		if err != nil {
			s.settle(msg, err, log)
			return
		}
	} else {
		s.metrics.JobAccepted()
		log.Info().Str("name", job.Name).Int("steps", len(job.Spec.Steps)).Msg("job accepted")
	}
	if err := s.dispatch.Materialise(ctx, job); err != nil {
		s.settle(msg, err, log)
		return
	}
	s.reply(ctx, msg, protocol.SubmitReply{JobID: jobID, Existing: existing}, log)
	s.settle(msg, s.dispatch.Advance(ctx, jobID), log)
}

// jobIDOf derives the job id: the Warden-Job-Id header, else the
// idempotency key (Nats-Msg-Id), else the submission's stream sequence and
// storage time, which are the same on every redelivery.
func (s *Scheduler) jobIDOf(msg jetstream.Msg) string {
	h := msg.Headers()
	if id := h.Get(protocol.HeaderJobID); id != "" {
		if !protocol.ValidToken(id) {
			return ""
		}
		return id
	}
	if key := h.Get(protocol.HeaderMsgID); key != "" {
		return protocol.JobIDForKey(key)
	}
	md, err := msg.Metadata()
	if err != nil {
		return protocol.NewJobID()
	}
	return protocol.JobIDForKey(strconv.FormatUint(md.Sequence.Stream, 10) + "@" + md.Timestamp.String())
}

// reject records a refused submission as an event, tells the submitter and
// removes the submission: it can never succeed.
func (s *Scheduler) reject(ctx context.Context, msg jetstream.Msg, jobID string, err error, log zerolog.Logger) {
	reason := spec.ReasonOf(err)
	if reason == "" {
		reason = spec.ReasonMalformed
	}
	s.metrics.SubmissionRejected(reason)
	log.Warn().Str("reason", reason).Err(err).Msg("submission rejected")
	md, _ := msg.Metadata()
	ev := protocol.Event{Kind: protocol.EventSubmissionRejected, ID: jobID, JobID: jobID, Reason: err.Error(),
		Data: map[string]string{"reason": reason}}
	if md != nil {
		ev.Data["stream_seq"] = strconv.FormatUint(md.Sequence.Stream, 10)
	}
	if ev.ID == "" {
		ev.ID = "_"
	}
	if perr := s.events.Publish(ctx, ev); perr != nil {
		// Without the event the rejection would be silent: hand the
		// submission back and try again.
		s.settle(msg, perr, log)
		return
	}
	s.reply(ctx, msg, protocol.SubmitReply{JobID: jobID, Error: err.Error()}, log)
	if terr := msg.TermWithReason("rejected: " + reason); terr != nil {
		log.Warn().Err(terr).Msg("term failed")
	}
}

// reply answers a submitter that asked for it. Best effort: the PubAck
// already told the submitter the job was accepted.
func (s *Scheduler) reply(ctx context.Context, msg jetstream.Msg, r protocol.SubmitReply, log zerolog.Logger) {
	to := msg.Headers().Get(protocol.HeaderReplyTo)
	if to == "" {
		return
	}
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	out := nats.NewMsg(to)
	out.Data = b
	if err := s.nc.PublishMsg(out); err != nil {
		log.Debug().Err(err).Msg("submission reply not sent")
	}
}

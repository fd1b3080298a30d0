package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/jobstore"
	"github.com/wardenhq/warden/pkg/logging"
	"github.com/wardenhq/warden/pkg/protocol"
)

// handleResult applies an agent's result to its step, then advances the job.
// A result whose epoch is not the step's is dropped and counted: it comes
// from an agent that lost the step (fencing).
func (s *Scheduler) handleResult(ctx context.Context, msg jetstream.Msg) {
	var r protocol.Result
	err := json.Unmarshal(msg.Data(), &r)
	if err == nil && (!protocol.ValidToken(r.JobID) || !protocol.ValidToken(r.StepID)) {
		err = errors.New("job_id and step_id must be valid ids")
	}
	if err != nil {
		s.log.Warn().Err(err).Str("subject", msg.Subject()).Msg("dropping undecodable result")
		_ = s.events.Publish(ctx, protocol.Event{Kind: "result_rejected", ID: "_", Reason: err.Error(),
			Data: map[string]string{"subject": msg.Subject()}})
		_ = msg.TermWithReason("undecodable result")
		return
	}
	log := s.log.With().Str(logging.FieldJob, r.JobID).Str(logging.FieldStep, r.StepID).
		Uint64(logging.FieldEpoch, r.Epoch).Str(logging.FieldAgent, r.Agent).Logger()

	for range 8 {
		st, rev, err := s.store.Step(ctx, r.JobID, r.StepID)
		if errors.Is(err, jobstore.ErrNotFound) {
			log.Warn().Msg("dropping result for an unknown step")
			_ = msg.TermWithReason("unknown step")
			return
		}
		if err != nil {
			s.settle(msg, err, log)
			return
		}
		if alreadyApplied(st, r) {
			// A redelivery after the record was written: finish the job's
			// advance, which may not have happened.
			s.settle(msg, s.dispatch.Advance(ctx, r.JobID), log)
			return
		}
		now := s.now().UTC()
		decision, delay, again := s.retry.Decide(st.Action, st.Retry, max(st.Attempt-1, 0), r.ErrorClass, r.Error, r.RetryAfter.Std(), rand.Float64)
		outcome, err := st.ApplyResult(r, again, now)
		if err == nil && r.Status != protocol.ResultSucceeded {
			if n := len(st.Attempts); n > 0 && st.Attempts[n-1].Epoch == r.Epoch {
				st.Attempts[n-1].Class = decision.Class
			}
			if outcome == jobstore.OutcomeRetry {
				st.NotBefore = now.Add(delay)
			}
		}
		if errors.Is(err, jobstore.ErrStale) {
			s.metrics.StaleResult()
			log.Warn().Err(err).Msg("stale result dropped")
			_ = s.events.Publish(ctx, protocol.Event{Kind: protocol.EventStaleResult, ID: r.JobID, JobID: r.JobID,
				StepID: r.StepID, Agent: r.Agent, Reason: err.Error(),
				Data: map[string]string{"result_epoch": strconv.FormatUint(r.Epoch, 10), "step_epoch": strconv.FormatUint(st.Epoch, 10)}})
			_ = msg.Ack()
			return
		}
		if err != nil {
			s.settle(msg, err, log)
			return
		}
		if _, err := s.store.UpdateStep(ctx, st, rev); err != nil {
			if errors.Is(err, jobstore.ErrConflict) {
				continue
			}
			s.settle(msg, err, log)
			return
		}
		s.metrics.ResultApplied(r.Status)
		// The agent has a free slot again, whatever its last heartbeat says.
		s.selector.Release(protocol.PresenceKey(st.Pool, r.Agent), r.FinishedAt)
		switch outcome {
		case jobstore.OutcomeSucceeded:
			log.Info().Msg("step succeeded")
		case jobstore.OutcomeRetry:
			log.Warn().Str("error", r.Error).Str("class", decision.Class).Int("attempt", st.Attempt).Int("max_retries", st.MaxRetries).
				Time("retry_at", st.NotBefore).Msg("step failed; retrying after backoff")
		case jobstore.OutcomeFailed:
			log.Warn().Str("error", r.Error).Str("class", decision.Class).Bool("retriable", decision.Retriable).Int("attempt", st.Attempt).Msg("step failed")
		}
		s.settle(msg, s.dispatch.Advance(ctx, r.JobID), log)
		return
	}
	s.settle(msg, jobstore.ErrConflict, log)
}

// alreadyApplied reports whether this exact result was written to the step
// before (the message was redelivered after the write).
func alreadyApplied(st *jobstore.Step, r protocol.Result) bool {
	for _, a := range st.Attempts {
		if a.Epoch == r.Epoch && a.Status == r.Status && a.FinishedAt.Equal(r.FinishedAt) && st.State != jobstore.StepDispatched {
			return true
		}
	}
	return false
}

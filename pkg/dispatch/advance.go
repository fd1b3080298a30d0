package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/jobstore"
	"github.com/wardenhq/warden/pkg/logging"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/selection"
)

// maxConflicts bounds how often advance reloads after losing a CAS race.
const maxConflicts = 8

// Advance moves a job forward: it skips steps that can no longer run,
// dispatches ready ones and records the job state the steps imply. It
// returns an error matching ErrWaiting if a ready step found no agent.
func (s *Dispatcher) Advance(ctx context.Context, jobID string) error {
	var err error
	for range maxConflicts {
		err = s.advanceOnce(ctx, jobID)
		if !errors.Is(err, jobstore.ErrConflict) {
			return err
		}
	}
	return err
}

func (s *Dispatcher) advanceOnce(ctx context.Context, jobID string) error {
	job, jrev, err := s.store.Job(ctx, jobID)
	if err != nil {
		return err
	}
	if job.State.Terminal() {
		return nil
	}
	vsteps, err := s.store.Steps(ctx, job)
	if err != nil {
		return err
	}
	if len(vsteps) != len(job.Spec.Steps) {
		// A scheduler died while materialising; finish its work.
		if err := s.Materialise(ctx, job); err != nil {
			return err
		}
		return fmt.Errorf("job %s was partly materialised: %w", jobID, jobstore.ErrConflict)
	}
	steps := make([]*jobstore.Step, len(vsteps))
	revs := make(map[string]uint64, len(vsteps))
	for i, v := range vsteps {
		steps[i] = v.Step
		revs[v.ID] = v.Revision
	}
	now := s.now().UTC()
	plan := jobstore.Evaluate(steps)
	for _, st := range plan.Skip {
		st.State = jobstore.StepSkipped
		st.LastError = "a dependency did not succeed"
		st.UpdatedAt, st.FinishedAt = now, now
		if _, err := s.store.UpdateStep(ctx, st, revs[st.ID]); err != nil {
			return err
		}
	}
	var waiting error
	var retryAt time.Time
	for _, st := range plan.Ready {
		if st.NotBefore.After(now) {
			// A retry in its backoff: not yet.
			if retryAt.IsZero() || st.NotBefore.Before(retryAt) {
				retryAt = st.NotBefore
			}
			continue
		}
		if err := s.dispatch(ctx, st, revs[st.ID]); err != nil {
			if errors.Is(err, ErrWaiting) {
				waiting = err
				continue
			}
			return err
		}
	}
	if len(plan.Skip) > 0 || len(plan.Ready) > 0 {
		plan = jobstore.Evaluate(steps)
	}
	if err := s.recordJobState(ctx, job, jrev, plan); err != nil {
		return err
	}
	if waiting == nil && !retryAt.IsZero() {
		return &WaitError{Until: retryAt}
	}
	return waiting
}

// dispatch places a ready step on an agent: epoch, actor and lease are
// written (CAS) before the task is published, so the store never lags a
// task. Losing the CAS means another scheduler dispatched it.
func (s *Dispatcher) dispatch(ctx context.Context, st *jobstore.Step, rev uint64) error {
	log := s.log.With().Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Logger()
	if now := s.now().UTC(); st.Expired(now) {
		log.Warn().Time("expires_at", st.ExpiresAt).Msg("step expired before it could start")
		st.Fail(fmt.Sprintf("%s: not started by %s", jobstore.ReasonExpired, st.ExpiresAt.Format(time.RFC3339)), now)
		_, err := s.store.UpdateStep(ctx, st, rev)
		return err
	}
	agent, err := s.selector.Choose(s.view.Pool(st.Pool), selection.Request{
		Pool: st.Pool, Agent: st.Agent, Action: st.Action, Requires: st.Requires,
	})
	if errors.Is(err, selection.ErrUnknownAction) {
		log.Warn().Err(err).Msg("step failed: unknown action")
		st.Fail(err.Error(), s.now().UTC())
		_, uerr := s.store.UpdateStep(ctx, st, rev)
		return uerr
	}
	if err != nil {
		// Say why on the step, once, so `warden job show` explains the wait.
		if why := err.Error(); st.Waiting != why {
			st.Waiting, st.UpdatedAt = why, s.now().UTC()
			if _, uerr := s.store.UpdateStep(ctx, st, rev); uerr != nil {
				return uerr
			}
		}
		return fmt.Errorf("step %s.%s: %w: %w", st.JobID, st.ID, ErrWaiting, err)
	}
	now := s.now().UTC()
	if err := st.Dispatch(agent.ID, now, s.cfg.DispatchGrace); err != nil {
		return err
	}
	newRev, err := s.store.UpdateStep(ctx, st, rev)
	if err != nil {
		return err
	}
	if err := s.publishTask(ctx, st, agent); err != nil {
		// Give the step back so a redelivery can dispatch it again; if this
		// write fails too, the lease (locked_until) is the supervisor's cue.
		log.Warn().Err(err).Msg("task publish failed; returning step to pending")
		st.State, st.Actor, st.LockedUntil = jobstore.StepPending, "", time.Time{}
		st.Attempt--
		st.Attempts = st.Attempts[:len(st.Attempts)-1]
		if _, uerr := s.store.UpdateStep(ctx, st, newRev); uerr != nil {
			log.Error().Err(uerr).Msg("could not return step to pending; the supervisor will recover it when its lease ends")
		}
		return err
	}
	s.metrics.StepDispatched()
	log.Info().Str(logging.FieldAgent, agent.ID).Uint64(logging.FieldEpoch, st.Epoch).Int("attempt", st.Attempt).
		Str("action", st.Action).Msg("step dispatched")
	return nil
}

func (s *Dispatcher) publishTask(ctx context.Context, st *jobstore.Step, agent protocol.Presence) error {
	task := protocol.Task{
		JobID: st.JobID, StepID: st.ID, Epoch: st.Epoch, Attempt: st.Attempt, Action: st.Action,
		Params: st.Params, Timeout: st.Timeout, Deadline: st.LockedUntil, ExpiresAt: st.ExpiresAt,
	}
	b, err := json.Marshal(task)
	if err != nil {
		return fmt.Errorf("encode task: %w", err)
	}
	subject := agent.TaskSubject
	if subject == "" {
		subject = protocol.TaskSubject(protocol.Shard(agent.Pool, agent.ID, s.cfg.TaskShards), agent.Pool, agent.ID)
	}
	msg := nats.NewMsg(subject)
	msg.Data = b
	msg.Header.Set(protocol.HeaderMsgID, protocol.TaskMsgID(st.JobID, st.ID, st.Epoch))
	msg.Header.Set(protocol.HeaderJob, st.JobID)
	msg.Header.Set(protocol.HeaderStep, st.ID)
	msg.Header.Set(protocol.HeaderEpoch, strconv.FormatUint(st.Epoch, 10))
	msg.Header.Set(protocol.HeaderAttempt, strconv.Itoa(st.Attempt))
	msg.Header.Set(protocol.HeaderAction, st.Action)
	msg.Header.Set(protocol.HeaderDeadline, st.LockedUntil.UTC().Format(time.RFC3339Nano))
	if st.Recoveries > 0 {
		msg.Header.Set(protocol.HeaderRecoveries, strconv.Itoa(st.Recoveries))
	}
	if st.TransferredFrom != "" {
		msg.Header.Set(protocol.HeaderTransferredFrom, st.TransferredFrom)
	}
	if _, err := s.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("publish task to %s: %w", subject, err)
	}
	return nil
}

// recordJobState writes the state the steps imply, if it changed.
func (s *Dispatcher) recordJobState(ctx context.Context, job *jobstore.Job, rev uint64, plan jobstore.Plan) error {
	if plan.State == job.State {
		return nil
	}
	now := s.now().UTC()
	job.State = plan.State
	job.UpdatedAt = now
	if plan.State.Terminal() {
		job.FinishedAt = now
		job.Error = plan.Error
	}
	if _, err := s.store.UpdateJob(ctx, job, rev); err != nil {
		return err
	}
	log := s.log.With().Str(logging.FieldJob, job.ID).Logger()
	if !plan.State.Terminal() {
		log.Debug().Str("state", string(plan.State)).Msg("job state")
		return nil
	}
	s.metrics.JobFinished(string(plan.State))
	s.logFinished(log, job)
	ev := protocol.Event{Kind: protocol.EventJobFinished, ID: job.ID, JobID: job.ID, Reason: job.Error,
		Data: map[string]string{"state": string(job.State), "duration": job.FinishedAt.Sub(job.CreatedAt).String()}}
	if err := s.events.Publish(ctx, ev); err != nil {
		log.Warn().Err(err).Msg("job finished event not published")
	}
	return nil
}

func (s *Dispatcher) logFinished(log zerolog.Logger, job *jobstore.Job) {
	e := log.Info()
	if job.State != jobstore.JobSucceeded {
		e = log.Warn().Str("error", job.Error)
	}
	e.Str("state", string(job.State)).Dur("duration", job.FinishedAt.Sub(job.CreatedAt)).Msg("job finished")
}

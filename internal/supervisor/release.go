package supervisor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Release statuses recorded in a step's retry chain.
const (
	statusLeaseExpired = "lease_expired"
	statusTransferred  = "transferred"
)

// cause says why a step is taken back from its agent and what must still
// hold for it to be taken back.
type cause struct {
	// status names the release in the retry chain (statusLeaseExpired,
	// statusTransferred); reason is the human explanation (empty: the
	// lease's end and holder, read from the step).
	status, reason string
	// agent and epoch, when set, must still be the step's actor and epoch:
	// a task of an older dispatch releases nothing.
	agent string
	epoch uint64
	// expired: release only if the step's lease has passed (it may have
	// been renewed since the index saw it).
	expired bool
	// suspect: the step was in its agent's hands when the agent failed or
	// its lease ran out, so this counts towards the poison threshold.
	suspect bool
	// task is the task message, copied to the dead-letter stream if the
	// step is parked as poison.
	task *jetstream.RawStreamMsg
}

// released is what release did to a step.
type released int

const (
	untouched released = iota // not the agent's (any more), or renewed
	requeued                  // back to pending: a scheduler re-dispatches it
	cancelled                 // its job is being cancelled: it ends cancelled
	parked                    // poison: dead-lettered
)

// releaser takes steps back from their agents (lease expired, agent
// failed) through the job store: CAS back to pending with the reason in
// the retry chain, or cancelled when cancel is the desired state (cancel
// wins: a step of a cancelled job is never dispatched again), or parked in
// the dead-letter stream when it keeps killing its agents. It never
// dispatches; the caller asks a scheduler to advance the job.
type releaser struct {
	term    *term
	store   *jobstore.Store
	dead    *deadLetters
	metrics *Metrics
	poison  int
	log     zerolog.Logger
}

// maxConflicts bounds how often a release reloads after losing a CAS race.
const maxConflicts = 8

// release takes step job.step back if c still applies to it.
//
// A poison park that lost its CAS left its dead letter stored: when the
// step then turns out to have moved on (c no longer holds, or the step is
// requeued or cancelled instead), the letter is withdrawn; a park that
// wins later relies on it (see parkedLetters).
func (r *releaser) release(ctx context.Context, job, step string, c cause) (released, error) {
	var sent parkedLetters
	for range maxConflicts {
		st, rev, err := r.store.Step(ctx, job, step)
		if errors.Is(err, jobstore.ErrNotFound) {
			r.dead.withdraw(ctx, sent, nil, parkedLetter{})
			return untouched, nil
		}
		if err != nil {
			return untouched, err
		}
		if !c.holds(st, r.term.now()) {
			r.dead.withdraw(ctx, sent, st, parkedLetter{})
			return untouched, nil
		}
		if c.reason == "" {
			c.reason = fmt.Sprintf("lease expired at %s on agent %s", st.LockedUntil.UTC().Format(time.RFC3339), st.Actor)
		}
		out, l, err := r.apply(ctx, st, rev, c)
		sent.add(l)
		if errors.Is(err, jobstore.ErrConflict) {
			continue
		}
		if err != nil {
			return out, err
		}
		r.dead.withdraw(ctx, sent, st, l) // l is zero unless parked
		return out, nil
	}
	return untouched, fmt.Errorf("release %s.%s: %w", job, step, jobstore.ErrConflict)
}

// holds reports whether c still applies to st at now.
func (c cause) holds(st *jobstore.Step, now time.Time) bool {
	switch {
	case st.State != jobstore.StepDispatched:
		return false
	case c.agent != "" && st.Actor != c.agent:
		return false
	case c.epoch != 0 && st.Epoch != c.epoch:
		return false
	case c.expired && now.Before(st.LockedUntil):
		return false
	}
	return true
}

// apply takes st back as c says; letter is the dead letter a poison park
// stored (zero if none), also when its CAS was lost.
func (r *releaser) apply(ctx context.Context, st *jobstore.Step, rev uint64, c cause) (out released, letter parkedLetter, err error) {
	cw, err := cancelWanted(ctx, r.store, st)
	if err != nil {
		return untouched, letter, err
	}
	switch {
	case cw:
		if err := endCancelled(ctx, r.term, r.log, st, rev, c.reason); err != nil {
			return untouched, letter, err
		}
		return cancelled, letter, nil
	case c.suspect && st.Recoveries+1 >= r.poison:
		why := fmt.Sprintf("poison: taken back from its agent %d times (last: %s)", st.Recoveries+1, c.reason)
		letter, err := r.dead.park(ctx, st, rev, protocol.DLQPoison, why, c.task, 0)
		if err != nil {
			return untouched, letter, err
		}
		r.dead.dropTask(ctx, c.task) // only now: a park tried again needs it (see park)
		return parked, letter, nil
	}
	if err := r.requeue(ctx, st, rev, c); err != nil {
		return untouched, letter, err
	}
	return requeued, letter, nil
}

// cancelWanted reports whether the step or its job is to be cancelled:
// then cancel wins over every other way of taking the step back (requeue,
// poison or max-deliveries park, transfer give-up). A compensating job's
// desired cancel (a cancel with compensation, a timeout, a plain cancel
// that came during the undo) stops nothing of the undo, as in the
// scheduler: its compensation steps are taken back like any other.
func cancelWanted(ctx context.Context, store *jobstore.Store, st *jobstore.Step) (bool, error) {
	if st.Desired == jobstore.StepCancelled {
		return true, nil
	}
	job, _, err := store.Job(ctx, st.JobID)
	if errors.Is(err, jobstore.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return job.StopsSteps(), nil
}

// requeue puts the step back to pending for a scheduler to re-dispatch.
func (r *releaser) requeue(ctx context.Context, st *jobstore.Step, rev uint64, c cause) error {
	agent, epoch := st.Actor, st.Epoch
	if err := st.Release(c.status, c.reason, c.suspect, r.term.now().UTC()); err != nil {
		return nil // not dispatched: nothing to take back
	}
	if _, err := r.term.updateStep(ctx, st, rev); err != nil {
		return err
	}
	r.metrics.recovered.WithLabelValues(c.status).Inc()
	r.log.Warn().Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Str(logging.FieldAgent, agent).
		Str("reason", c.reason).Int("recoveries", st.Recoveries).Msg("step taken back; a scheduler re-dispatches it")
	r.term.note(ctx, r.log, protocol.Event{Kind: protocol.EventStepRecovered, ID: st.JobID, JobID: st.JobID, StepID: st.ID,
		Agent: agent, Reason: c.reason, Data: map[string]string{"status": c.status, "epoch": strconv.FormatUint(epoch, 10)}})
	return nil
}

// endCancelled ends a step whose job is being cancelled and whose agent
// never confirmed the cancel: its lease ended (or its agent failed, or its
// task ran out of deliveries: reason says which), so nothing runs it any
// more, and it is never dispatched again. It writes st at rev.
func endCancelled(ctx context.Context, t *term, log zerolog.Logger, st *jobstore.Step, rev uint64, reason string) error {
	now := t.now().UTC()
	agent, epoch := st.Actor, st.Epoch
	why := protocol.ErrorCancelled + ": the agent did not confirm the cancel before " + reason
	st.EndAttempt(string(jobstore.StepCancelled), reason, now)
	st.Desired, st.State = jobstore.StepCancelled, jobstore.StepCancelled
	st.LastError, st.UpdatedAt, st.FinishedAt, st.LockedUntil = why, now, now, time.Time{}
	if _, err := t.updateStep(ctx, st, rev); err != nil {
		return err
	}
	log.Warn().Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Str(logging.FieldAgent, agent).
		Str("reason", reason).Msg("step of a cancelled job ended cancelled; not re-dispatched")
	t.note(ctx, log, protocol.Event{Kind: protocol.EventStepCancelled, ID: st.JobID, JobID: st.JobID, StepID: st.ID,
		Agent: agent, Reason: why, Data: map[string]string{"epoch": strconv.FormatUint(epoch, 10)}})
	return nil
}

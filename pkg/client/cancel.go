package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
)

// CancelReport says what a cancel did.
type CancelReport struct {
	JobID string `json:"job_id"`
	// Cancelled are steps that had not started; they are cancelled now.
	Cancelled []string `json:"cancelled"`
	// Interrupted are running steps whose agent was told to stop; they end
	// cancelled when the agent reports.
	Interrupted []string `json:"interrupted"`
	// Unreached are running steps whose agent did not confirm; they end
	// cancelled when a result comes, whatever it says, unless it succeeded.
	Unreached []string `json:"unreached,omitempty"`
}

// Cancel cancels a job. Its desired state becomes cancelled, durably, on
// the job record; then the job's scheduler re-reads it and, in one turn,
// cancels the steps not started, marks the running ones cancelled-desired
// and tells their agents to stop (the handler's context ends with
// agent.ErrCancelled). That turn is the cancel's effective time: Cancel
// returns after it, and no step is dispatched after it (a scheduler holding
// an older copy of the job fails its next write, because every unfinished
// step record changed, and re-reads). A running step ends cancelled with its
// result, or when its lease ends if its agent never answers. If no
// scheduler answers, Cancel writes the steps' desired state itself, so the
// cancel holds whichever scheduler comes next. Follow waits for the job to
// end, which is then cancelled, never succeeded.
//
// A job accepted but not made yet — one with run_at or delay before its
// start time, or one whose submission waits for a scheduler — has no
// record: Cancel writes its records ended cancelled (every step in
// CancelReport.Cancelled), and the scheduler that takes its submission
// later finds the job ended and runs nothing. Those records are kept
// until the job's start time plus the retention.
//
// Errors: ErrNotFound if there is no such job, ErrFinished if it has
// already ended.
func (c *Client) Cancel(ctx context.Context, jobID string) (CancelReport, error) {
	return c.cancel(ctx, jobID, false)
}

// CancelCompensate cancels like Cancel and, once every step has stopped,
// has the steps that succeeded undone (their compensate: actions, in
// reverse dependency order); the job ends compensated or
// compensation_failed instead of cancelled.
func (c *Client) CancelCompensate(ctx context.Context, jobID string) (CancelReport, error) {
	return c.cancel(ctx, jobID, true)
}

func (c *Client) cancel(ctx context.Context, jobID string, compensate bool) (CancelReport, error) {
	rep := CancelReport{JobID: jobID}
	if !protocol.ValidToken(jobID) {
		return rep, fmt.Errorf("job %q: %w", jobID, ErrNotFound)
	}
	store, err := c.store(ctx)
	if err != nil {
		return rep, err
	}
	var snap *jobstore.Snapshot
	for range 8 {
		snap, err = markJobCancelled(ctx, store, jobID, compensate)
		if errors.Is(err, jobstore.ErrNotFound) {
			// No record: the job may be accepted and not made yet (held
			// until its start time, or queued for a scheduler). It is
			// cancelled by writing its records ended; if a scheduler made
			// it meanwhile (ErrExists), that record is cancelled instead.
			var steps []string
			if steps, err = c.cancelHeld(ctx, store, jobID, compensate); err == nil {
				rep.Cancelled = steps
				return rep, nil
			}
			if errors.Is(err, jobstore.ErrExists) {
				continue
			}
		}
		if !errors.Is(err, jobstore.ErrConflict) {
			break
		}
	}
	if errors.Is(err, jobstore.ErrNotFound) {
		return rep, fmt.Errorf("job %s: %w", jobID, ErrNotFound)
	}
	if err != nil {
		return rep, err
	}
	for _, st := range snap.Steps {
		switch st.State {
		case jobstore.StepPending:
			rep.Cancelled = append(rep.Cancelled, st.ID)
		case jobstore.StepDispatched:
			rep.Interrupted = append(rep.Interrupted, st.ID)
		}
	}
	if err := c.advance(ctx, jobID); err == nil || snap.Job.Inline {
		return rep, nil
	}
	for range 8 {
		if err = markStepsCancelled(ctx, store, jobID); !errors.Is(err, jobstore.ErrConflict) {
			break
		}
	}
	return rep, err
}

// advance asks a scheduler to advance the job now and waits for its answer.
func (c *Client) advance(ctx context.Context, jobID string) error {
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := c.nc.RequestWithContext(actx, protocol.SubjectControlAdvance, []byte(jobID))
	if err != nil {
		return fmt.Errorf("ask a scheduler to advance job %s: %w", jobID, err)
	}
	_, err = protocol.ParseReply(m.Data)
	return err
}

// markJobCancelled writes desired cancelled on the job record (and on an
// inline job's step, which lives in it).
func markJobCancelled(ctx context.Context, store *jobstore.Store, jobID string, compensate bool) (*jobstore.Snapshot, error) {
	snap, err := store.Load(ctx, jobID)
	if err != nil {
		return nil, err
	}
	j := snap.Job
	if j.State.Terminal() {
		return nil, fmt.Errorf("%w: %s is %s", ErrFinished, jobID, j.State)
	}
	if len(snap.Steps) > 0 && !slices.ContainsFunc(snap.Steps, func(st *jobstore.Step) bool { return !st.State.Terminal() }) {
		// Every step has ended and the scheduler is writing the job's end
		// (its step records first): a cancel now would turn the outcome
		// into cancelled, or undo finished work.
		return nil, fmt.Errorf("%w: every step of %s has ended; the job is finishing", ErrFinished, jobID)
	}
	now := time.Now().UTC()
	j.Desired, j.UpdatedAt = jobstore.JobCancelled, now
	j.CompensateOnCancel = j.CompensateOnCancel || compensate
	if j.Inline {
		for _, st := range snap.Steps {
			if !st.State.Terminal() {
				st.Desired, st.UpdatedAt = jobstore.StepCancelled, now
			}
		}
		j.Steps = snap.Steps
	}
	if _, err := store.UpdateJob(ctx, j, snap.JobRev); err != nil {
		return nil, err
	}
	return snap, nil
}

// markStepsCancelled writes desired cancelled on every unfinished step
// record, pipelined; a step that changed meanwhile is read again.
func markStepsCancelled(ctx context.Context, store *jobstore.Store, jobID string) error {
	snap, err := store.Load(ctx, jobID)
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	b := store.Batch()
	for _, st := range snap.Steps {
		if !st.State.Terminal() && st.Desired != jobstore.StepCancelled {
			st.Desired, st.UpdatedAt = jobstore.StepCancelled, now
			b.Add(store.StepWrite(st, snap.Revs[st.ID]))
		}
	}
	for _, r := range b.Wait(ctx) {
		if r.Err != nil {
			return r.Err
		}
	}
	return nil
}

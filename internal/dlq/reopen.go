package dlq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/spec"
)

// ErrJobCancelled: the step's job is cancelled, or being cancelled, and a
// reopen would undo that. It matches ErrWrongState (a conflict, exit 2).
var ErrJobCancelled = fmt.Errorf("%w: job cancelled", ErrWrongState)

// JobCancelledError refuses to reopen a step of a job an operator
// cancelled: retrying its dead letter ran the step again and turned the
// job's desired state back to succeeded, so a cancel in progress was
// undone (the job could end succeeded) and a cancelled job ran again.
// Running a cancelled job again is asked for explicitly, once it has
// ended: `warden job retry` (ops.RetryJob).
type JobCancelledError struct {
	Job  string
	Step string
	// State is the job's state: cancelled (or, for a cancel that stopped
	// nothing, succeeded) once it has ended; running or pending while
	// the cancel is carried out.
	State jobstore.JobState
}

func (e *JobCancelledError) Error() string {
	if e.State.Terminal() {
		was := "was cancelled"
		if e.State != jobstore.JobCancelled {
			was += " (it ended " + string(e.State) + ")"
		}
		return fmt.Sprintf("job %s %s: step %s is not run again by a dead-letter retry; "+
			"`warden job retry %s` runs the job's failed, dead-lettered, cancelled and expired steps again", e.Job, was, e.Step, e.Job)
	}
	return fmt.Sprintf("job %s is being cancelled: step %s is not run again; "+
		"once the job has ended, `warden job retry %s` runs its failed, dead-lettered, cancelled and expired steps again", e.Job, e.Step, e.Job)
}

// Unwrap makes errors.Is(err, ErrJobCancelled) and ErrWrongState hold.
func (e *JobCancelledError) Unwrap() error { return ErrJobCancelled }

// reopenRequest says what a reopen takes.
type reopenRequest struct {
	job string
	// step is the one step to reopen, in one of the states from. Empty:
	// every failed, dead-lettered, cancelled and expired step of a
	// finished job (a job retry).
	step string
	from []jobstore.StepState
	// keepCancel refuses a job that ended cancelled too, not only one
	// being cancelled (a dead-letter retry: only a job retry, asked for
	// the whole job, runs a cancelled job again).
	keepCancel bool
}

// retryable are the step states a job retry reopens.
var retryable = []jobstore.StepState{jobstore.StepFailed, jobstore.StepDeadLettered, jobstore.StepCancelled, jobstore.StepExpired}

// Reopen puts a dead-lettered, failed, cancelled or expired step back to
// pending with a fresh attempt budget and expiry (expiryOnReopen), and
// reopens its job and the steps skipped in its wake.
// It refuses a job being cancelled (JobCancelledError).
func Reopen(ctx context.Context, store *jobstore.Store, jobID, stepID string, now time.Time) error {
	_, err := reopen(ctx, store, reopenRequest{job: jobID, step: stepID, from: retryable}, now)
	return err
}

// RetryJob reopens, in one pass, a finished job's failed, dead-lettered,
// cancelled and expired steps with a fresh attempt budget and expiry
// (expiryOnReopen), the steps skipped in
// their wake, and the job; it returns the steps it reopened. A finished
// job whose only open steps are pending (a retry whose job write failed
// left them so) has its reopen finished and those returned. Each record is
// read once and written at most once, the step records pipelined and each
// at the revision read, then the job record at its own: a job of 1,000
// steps costs about as many writes, not one rewrite of every step per
// failed step. On an error the steps returned (if any) did land.
func RetryJob(ctx context.Context, store *jobstore.Store, jobID string, now time.Time) ([]string, error) {
	return reopen(ctx, store, reopenRequest{job: jobID, from: retryable}, now)
}

// reopen carries out r in one pass over one snapshot of the job (read
// again only after a lost compare-and-set): the steps it reopens, then the
// skipped steps (pending again: the scheduler skips them again if another
// dependency still failed), each group pipelined, then the job record,
// running, then the ended steps whose records carry the retention TTL its
// job's end gave them (written as they are, without it: a job reopened
// near its retention lost its succeeded steps' records while it ran
// again, and the scheduler took them for steps never created and ran them
// again; the job's next end gives it back; keepEnded says why last).
// The job record is written even when the job is open: one whose steps
// had all ended may be writing its terminal record (sealing), and that
// write must lose its compare-and-set and read the reopened step, not end
// the job over it.
// The job's write is at the revision the decision was taken on, so a
// cancel that lands meanwhile is read again and refused, never undone.
// It returns the steps it reopened (their writes landed), also on error.
func reopen(ctx context.Context, store *jobstore.Store, r reopenRequest, now time.Time) ([]string, error) {
	var done []string // steps reopened by an earlier pass of this call
	for range 8 {
		snap, err := store.Load(ctx, r.job)
		if err != nil {
			return done, err
		}
		job := snap.Job
		if err := refuse(job, r); err != nil {
			return done, err
		}
		targets, stranded, err := pick(snap, r, done)
		if err != nil {
			return done, err
		}
		var (
			// In snapshot order: the steps reopened, the skipped ones,
			// and the ended ones whose records carry the TTL.
			reopened, skipped, ended []*jobstore.Step
			target                   = make(map[string]bool, len(targets))
		)
		for _, id := range targets {
			target[id] = true
		}
		for _, st := range snap.Steps {
			switch {
			case target[st.ID]:
				st.State, st.Desired, st.Actor, st.LockedUntil, st.FinishedAt = jobstore.StepPending, jobstore.StepSucceeded, "", time.Time{}, time.Time{}
				st.Attempt, st.ErrorCount, st.Recoveries = 0, 0, 0
				st.NotBefore, st.ExpiresAt = time.Time{}, expiryOnReopen(job, st, now)
				st.LastError = "reopened by an operator after: " + st.LastError
				st.UpdatedAt = now
				reopened = append(reopened, st)
			case st.State == jobstore.StepSkipped:
				// It never ran: its expiry is renewed as a reopened
				// step's, or it expired when the retried step let it run.
				st.State, st.FinishedAt, st.LastError, st.UpdatedAt = jobstore.StepPending, time.Time{}, "", now
				st.NotBefore, st.ExpiresAt = time.Time{}, expiryOnReopen(job, st, now)
				skipped = append(skipped, st)
			case st.State.Terminal() && snap.Expiring[st.ID]:
				// Written as it is (jobstore.StepWrite carries no TTL),
				// once the job record is open (keepEnded).
				ended = append(ended, st)
			}
		}
		if !job.Inline {
			// The reopened steps first, then the skipped ones: a finished
			// job none of whose steps could be reopened (a write failed)
			// is left as it was, its records' retention with it.
			var failed error
			conflict := false
			for _, group := range [][]*jobstore.Step{reopened, skipped} {
				if failed != nil || conflict {
					break
				}
				for i, res := range writeSteps(ctx, store, snap, group) {
					switch {
					case res.Err == nil:
						if target[group[i].ID] {
							done = append(done, group[i].ID)
						}
					case !errors.Is(res.Err, jobstore.ErrConflict):
						if failed == nil {
							failed = res.Err
						}
					default:
						// Someone else wrote the step meanwhile (a scheduler
						// ending or sealing the job): read again. A skipped
						// one left skipped would never run while the job,
						// reopened, could end succeeded.
						conflict = true
					}
				}
			}
			switch {
			case failed != nil && len(done) == 0:
				return done, failed
			case failed != nil:
				// Some steps are reopened: their job is too, so they
				// run, and the error says the rest were not.
				if err := reopenJobRecord(ctx, store, snap, now); err != nil {
					return done, fmt.Errorf("%w; nor was the job reopened: %w", failed, err)
				}
				keepEnded(ctx, store, snap, ended)
				return done, failed
			case conflict:
				continue
			}
		}
		// An inline job's steps are in its record (snap.Steps are
		// job.Steps): this one write reopens them all.
		if err := reopenJobRecord(ctx, store, snap, now); errors.Is(err, jobstore.ErrConflict) {
			continue
		} else if err != nil {
			if len(done) > 0 {
				return done, fmt.Errorf("steps of job %s reopened, but not the job (retry the job to finish it): %w", r.job, err)
			}
			return done, err
		}
		keepEnded(ctx, store, snap, ended)
		if job.Inline {
			done = append(done, targets...)
		}
		if len(done) == 0 && len(stranded) > 0 {
			done = stranded
		}
		return done, nil
	}
	return done, fmt.Errorf("reopen job %s: %w", r.job, jobstore.ErrConflict)
}

// keepEnded writes the records of a reopened job's ended steps again
// without the retention TTL its end gave them (jobstore.StepWrite carries
// none), each at the revision read. Only once the job record is open
// again: written before, in the same batch as the reopened steps, they
// lost their TTL also when the reopen then failed (a step record too large
// to write, the connection lost) and left the job finished, which no
// scheduler touches again, so they outlived their job for ever. A write
// that fails is left to the scheduler, which takes the TTL of an open
// job's records back itself (settleExpiry); one that lost its
// compare-and-set was written by it already.
func keepEnded(ctx context.Context, store *jobstore.Store, snap *jobstore.Snapshot, ended []*jobstore.Step) {
	writeSteps(ctx, store, snap, ended)
}

// writeSteps writes steps pipelined, each at the revision read in snap,
// and returns their outcomes in order.
func writeSteps(ctx context.Context, store *jobstore.Store, snap *jobstore.Snapshot, steps []*jobstore.Step) []jobstore.Result {
	if len(steps) == 0 {
		return nil
	}
	b := store.Batch()
	for _, st := range steps {
		b.Add(store.StepWrite(st, snap.Revs[st.ID]))
	}
	return b.Wait(ctx)
}

// reopenJobRecord writes the job record of snap running (if it had
// ended), at the revision read: a job whose steps had all ended and whose
// scheduler is writing its end then loses that write's compare-and-set.
// A job that lost it to a cancel is read again, and refused.
func reopenJobRecord(ctx context.Context, store *jobstore.Store, snap *jobstore.Snapshot, now time.Time) error {
	job := snap.Job
	if job.State.Terminal() {
		job.Reopen(now) // a timeout, if any, starts again
	}
	job.UpdatedAt = now
	_, err := store.UpdateJob(ctx, job, snap.JobRev)
	return err
}

// refuse says why the job's steps are not reopened: its compensation ran
// or runs (its completed steps' effects were undone, and compensation is
// planned once per job, so a reopened forward step would run beside the
// undo, compensation_failed, or end the job succeeded with its work
// undone, compensated: such a job is submitted again instead); it is
// being cancelled, or, for a dead-letter retry, was cancelled. A job retry
// of a job that has not ended is refused by pick, only when none of its
// steps failed: a retry that failed part-way leaves the job running with
// steps still failed, and was refused when tried again ("only a finished
// job can be retried") while those steps failed the job once more.
func refuse(job *jobstore.Job, r reopenRequest) error {
	// A job that timed out is being cancelled while its steps stop; once
	// it has ended (failed) its dead letters may be retried as any failed
	// job's.
	cancelled := job.CancelRequested() || job.Desired == jobstore.JobCancelled && !job.State.Terminal() ||
		job.State == jobstore.JobCancelled
	switch {
	case job.State.Compensation():
		return fmt.Errorf("%w: job %s is %s: its completed steps were undone, so its steps cannot be reopened; submit the job again",
			ErrWrongState, job.ID, job.State)
	case cancelled && (!job.State.Terminal() || r.keepCancel):
		return &JobCancelledError{Job: job.ID, Step: r.step, State: job.State}
	}
	return nil
}

// pick returns the steps r reopens in snap, none of done; and, for a job
// retry that finds none, the pending steps of a finished job (stranded:
// reopened by a retry whose job write failed), whose reopen it finishes.
func pick(snap *jobstore.Snapshot, r reopenRequest, done []string) (targets, stranded []string, err error) {
	job := snap.Job
	switch {
	case r.step != "":
		if slices.Contains(done, r.step) {
			return nil, nil, nil
		}
		i := slices.IndexFunc(snap.Steps, func(st *jobstore.Step) bool { return st.ID == r.step })
		if i < 0 {
			return nil, nil, fmt.Errorf("step %s.%s: %w", r.job, r.step, jobstore.ErrNotFound)
		}
		if st := snap.Steps[i]; !slices.Contains(r.from, st.State) {
			return nil, nil, fmt.Errorf("%w: step %s.%s is %s, not %v", ErrWrongState, r.job, r.step, st.State, r.from)
		}
		return []string{r.step}, nil, nil
	}
	reopened := make(map[string]bool, len(done))
	for _, id := range done {
		reopened[id] = true
	}
	ofSpec := make(map[string]bool, len(job.Spec.Steps))
	for _, sp := range job.Spec.Steps {
		ofSpec[sp.ID] = true
	}
	for _, st := range snap.Steps {
		switch {
		case reopened[st.ID]:
		case slices.Contains(r.from, st.State):
			targets = append(targets, st.ID)
		case st.State == jobstore.StepPending && job.State.Terminal() && ofSpec[st.ID]:
			// Only a step of the job's spec, not a stray compensation record.
			stranded = append(stranded, st.ID)
		}
	}
	if len(targets) == 0 && len(stranded) == 0 && len(done) == 0 {
		if !job.State.Terminal() {
			return nil, nil, fmt.Errorf("%w: job %s is %s and none of its steps has failed: only a finished job, or one with failed, dead-lettered, cancelled or expired steps, can be retried", ErrWrongState, job.ID, job.State)
		}
		return nil, nil, fmt.Errorf("%w: job %s has no failed, dead-lettered, cancelled or expired step to retry", ErrWrongState, r.job)
	}
	return targets, stranded, nil
}

// expiryOnReopen is when step st of job, reopened at now, expires if it
// has not started. A reopen materialises the step again, so the rule is
// the one it was created by (spec.Job.StepExpiryAt, jobstore.NewSteps)
// taken from now: the step's ttl (expires_in) and the job's ttl run again
// from the retry, and an absolute expires_at still ahead is kept. One
// already past at now is dropped (the retry is an operator's explicit ask
// to run the step: kept, it expired the step at its first dispatch
// without running it). A step whose spec gives no expiry had the
// scheduler's default_task_expiry, whose duration its record does not
// keep: its window, ExpiresAt less CreatedAt (when NewSteps made it),
// runs again from now; one without an expiry keeps none.
func expiryOnReopen(job *jobstore.Job, st *jobstore.Step, now time.Time) time.Time {
	j := job.Spec // a copy: the past deadlines are dropped from it only
	i := slices.IndexFunc(j.Steps, func(s spec.Step) bool { return s.ID == st.ID })
	if i < 0 || j.StepExpiryAt(j.Steps[i], st.CreatedAt).IsZero() {
		if d := st.ExpiresAt.Sub(st.CreatedAt); !st.ExpiresAt.IsZero() && d > 0 {
			return now.Add(d)
		}
		return time.Time{}
	}
	s := j.Steps[i]
	if j.ExpiresAt != nil && !j.ExpiresAt.After(now) {
		j.ExpiresAt = nil
	}
	if s.ExpiresAt != nil && !s.ExpiresAt.After(now) {
		s.ExpiresAt = nil
	}
	return j.StepExpiryAt(s, now)
}

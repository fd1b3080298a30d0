package scheduler

import (
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/logging"
)

// timeoutWakeHorizon: a deadline further ahead arms no wake (a timer per
// job for as long as a year); the job's next turn within the horizon arms
// it, and the supervisor asks for the job at its deadline in any case.
const timeoutWakeHorizon = 10 * time.Minute

// deadlineWake is the timer that brings a job back at its deadline.
type deadlineWake struct {
	at    time.Time
	timer *time.Timer
}

// timeOut enforces a job's timeout (spec.Job.Timeout, its record's
// Deadline) at each of its turns. Before the deadline it arms a wake for
// it: a job whose steps run long gets no turn otherwise. Past it, the job
// is cancelled as an operator's cancel would (pending steps end
// cancelled, running ones are told to stop) and marked timed out, which
// makes it end failed, compensating first if it has anything to undo.
// The supervisor's recovery asks for the job at its deadline too (the
// record's Warden-Deadline header), in case the wake went with this
// process. A job with no step open (it is ending: its last result came in
// this turn, or its records are being sealed) is not timed out, nor is a
// compensating one: its undo runs to the end.
func (w *worker) timeOut(jt *jobTurn, now time.Time) {
	js := jt.js
	j := js.job
	if j.Deadline.IsZero() {
		return
	}
	if !j.TimeoutPending() || js.open == 0 {
		w.forgetDeadline(j.ID) // nothing left for a wake to do
		return
	}
	if now.Before(j.Deadline) {
		if j.Deadline.Sub(now) <= timeoutWakeHorizon {
			w.wakeAtDeadline(j.ID, j.Deadline)
		}
		return
	}
	w.forgetDeadline(j.ID)
	j.Desired, j.TimedOut, j.UpdatedAt = jobstore.JobCancelled, true, now
	js.dirtyJob = true
	jt.count(-1, func(m Metrics, _ string) { m.JobTimedOut() }, "")
	w.log.Warn().Str(logging.FieldJob, j.ID).Time("deadline", j.Deadline).Stringer("timeout", j.Spec.Timeout).
		Msg("job timed out: cancelling its steps")
}

// wakeAtDeadline arms, once per deadline, a wake of job at its deadline.
// A gate's wake (wakeAt) is kept apart: it is dropped when due, and one
// job's gate wakes would replace its deadline's. The wake reads the job
// again (reload): the scheduler that armed it may no longer own the job
// (a bare submission is accepted by any scheduler, its results go to its
// partition's owner), and its cached copy may be old.
func (w *worker) wakeAtDeadline(job string, at time.Time) {
	if d, ok := w.deadlines[job]; ok && d.at.Equal(at) {
		return
	}
	w.forgetDeadline(job)
	w.deadlines[job] = deadlineWake{at: at, timer: time.AfterFunc(max(at.Sub(w.s.now()), 0), func() {
		w.q.push(input{kind: inWake, job: job, at: w.s.now(), reload: true})
	})}
}

// forgetDeadline stops the deadline wake of job, if it has one: it ended,
// or its deadline passed.
func (w *worker) forgetDeadline(job string) {
	if d, ok := w.deadlines[job]; ok {
		d.timer.Stop()
		delete(w.deadlines, job)
	}
}

package scheduler

import (
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/logging"
)

// timeOut enforces a job's timeout (spec.Job.Timeout, its record's
// Deadline) at each of its turns. Before the deadline it arms a wake for
// it: a job whose steps run long gets no turn otherwise. Past it, the job
// is cancelled as an operator's cancel would (pending steps end
// cancelled, running ones are told to stop) and marked timed out, which
// makes it end failed, compensating first if it has anything to undo.
// The supervisor's recovery asks for the job at its deadline too (the
// record's Warden-Deadline header), in case the wake went with this
// process. A compensating job is past the point where a timeout stops
// anything: its undo runs to the end.
// timeoutWakeHorizon: a deadline further ahead arms no wake (a timer and
// an entry per job for as long as a year); the job's next turn within the
// horizon arms it, and the supervisor asks for the job at its deadline
// in any case.
const timeoutWakeHorizon = 10 * time.Minute

func (w *worker) timeOut(jt *jobTurn, now time.Time) {
	j := jt.js.job
	if j.Deadline.IsZero() || j.State.Terminal() || j.State == jobstore.JobCompensating || j.Desired == jobstore.JobCancelled {
		return
	}
	if now.Before(j.Deadline) {
		if j.Deadline.Sub(now) <= timeoutWakeHorizon {
			w.wakeAt(j.ID, j.Deadline)
		}
		return
	}
	j.Desired, j.TimedOut, j.UpdatedAt = jobstore.JobCancelled, true, now
	jt.js.dirtyJob = true
	w.log.Warn().Str(logging.FieldJob, j.ID).Time("deadline", j.Deadline).Stringer("timeout", j.Spec.Timeout).
		Msg("job timed out: cancelling its steps")
}

package scheduler

// Compensation (seed 002; planner in internal/compensate). When a job's
// steps have all ended and one failed for good (failed, dead-lettered, or
// expired before it could start: the job cannot complete either way), the
// steps that succeeded and declare `compensate:` are undone: their compensation steps are
// appended to the job (spec and records) with dependencies in reverse
// order, and run as ordinary steps — fenced by epoch, leased, retried with
// their own policy, recovered by the supervisor. The job is compensating
// meanwhile, then compensated, or compensation_failed when one of them
// failed for good (those that had to wait for it are skipped).

import (
	"fmt"
	"strings"
	"time"

	"github.com/wardenhq/warden/internal/compensate"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// startCompensation turns a job that just failed into a compensating one,
// if it has anything to undo, and says whether it did.
func (w *worker) startCompensation(jt *jobTurn, now time.Time) bool {
	js := jt.js
	j := js.job
	if js.open > 0 || j.State.Terminal() || j.State == jobstore.JobCompensating || j.ForwardSteps > 0 ||
		(j.CancelRequested() && !j.CompensateOnCancel) {
		return false
	}
	// A permanent failure, a timeout or a cancel that asked for
	// compensation, that stopped something (one that came after every step had succeeded
	// leaves the job succeeded: settle).
	failed := j.Desired == jobstore.JobCancelled && !js.cancelStoppedNothing()
	in := make([]compensate.Step, len(js.steps))
	for i, st := range js.steps {
		if forwardFailure(st.State) {
			failed = true
		}
		s := compensate.Step{ID: st.ID, DependsOn: st.DependsOn, Compensable: j.Spec.Steps[i].Compensate != nil}
		if st.State == jobstore.StepSucceeded {
			s.Status = compensate.Succeeded
		}
		in[i] = s
	}
	if !failed {
		return false
	}
	plan, err := compensate.Plan(in)
	if err != nil || len(plan) == 0 {
		return false
	}
	var specs []spec.Step
	var order []string
	for _, c := range plan {
		cs, _ := j.Spec.Steps[js.byID[c.Of]].CompensationStep()
		for _, a := range c.After {
			cs.DependsOn = append(cs.DependsOn, spec.CompensationID(a))
		}
		specs = append(specs, cs)
		order = append(order, c.Of)
	}
	recs, err := w.s.undoRecords(j.ID, specs, now)
	if err != nil {
		w.log.Warn().Err(err).Str(logging.FieldJob, j.ID).Msg("compensation not started: its steps are invalid")
		return false
	}
	j.ForwardSteps = len(j.Spec.Steps)
	j.Spec.Steps = append(j.Spec.Steps, specs...)
	j.State, j.UpdatedAt = jobstore.JobCompensating, now
	js.dirtyJob = true
	for _, st := range recs {
		js.byID[st.ID] = len(js.steps)
		js.steps = append(js.steps, st)
		js.revs = append(js.revs, js.strays[st.ID]) // 0 (create) unless a stray holds the key
		js.expiring = append(js.expiring, false)
	}
	js.index(now)
	for i := j.ForwardSteps; i < len(js.steps); i++ {
		js.markGuarded(i) // after the job record that starts the compensation
	}
	w.log.Warn().Str(logging.FieldJob, j.ID).Strs("undo", order).Str("error", j.Error).Msg("job failed; compensating")
	ev := protocol.Event{Kind: protocol.EventJobCompensating, ID: j.ID, JobID: j.ID, Reason: js.failure(),
		Data: map[string]string{"plan": strings.Join(order, ",")}}
	jt.events = append(jt.events, outEvent{Event: ev, dedup: "start", write: -1})
	return true
}

// forwardFailure reports whether a forward step in state s ended so that
// its job cannot complete, which undoes the job's compensable steps. An
// expired step counts: the job ended without it, and the steps that had
// succeeded (a seat reserved, a card not charged) were left done.
func forwardFailure(s jobstore.StepState) bool {
	return s == jobstore.StepFailed || s == jobstore.StepDeadLettered || s == jobstore.StepExpired
}

// failure describes the first forward step that failed (else the first
// that expired), or the cancel that asked for compensation. A failure
// comes first: a plain cancel of a job already compensating changes
// nothing but its desired state, and named the cancel as the job's error
// instead of the step that failed.
func (js *jobState) failure() string {
	failed, expired := firstFailures(js.steps[:max(js.job.ForwardSteps, 0)])
	switch {
	case failed != "":
		return failed
	case expired != "":
		return expired
	case js.job.TimedOut:
		return js.job.TimeoutError()
	case js.job.Desired == jobstore.JobCancelled:
		return "cancelled with compensation"
	}
	return ""
}

// firstFailures words, as a job's error names them, the first of steps
// that failed or was dead-lettered and the first that expired.
func firstFailures(steps []*jobstore.Step) (failed, expired string) {
	for _, st := range steps {
		switch st.State {
		case jobstore.StepFailed, jobstore.StepDeadLettered:
			if failed == "" {
				failed = fmt.Sprintf("step %s %s: %s", st.ID, st.State, st.LastError)
			}
		case jobstore.StepExpired:
			if expired == "" {
				expired = fmt.Sprintf("step %s %s", st.ID, st.LastError)
			}
		}
	}
	return failed, expired
}

// endCompensation settles a compensating job whose steps have all ended.
func (js *jobState) endCompensation(now time.Time) bool {
	j := js.job
	j.State = jobstore.JobCompensated
	var bad []string
	for _, st := range js.steps[j.ForwardSteps:] {
		if st.State != jobstore.StepSucceeded {
			bad = append(bad, fmt.Sprintf("%s %s", st.ID, st.State))
		}
	}
	if len(bad) > 0 {
		j.State = jobstore.JobCompensationFailed
	}
	j.Error = js.failure()
	if len(bad) > 0 {
		j.Error += "; compensation: " + strings.Join(bad, ", ")
	}
	j.UpdatedAt, j.FinishedAt = now, now
	js.dirtyJob = true
	return true
}

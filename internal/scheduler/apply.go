package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// errPartial says a job's records are incomplete (a scheduler died while
// creating them); loading completes them.
var errPartial = errors.New("partly materialised")

// prepare applies a job's inputs to its state and decides its writes,
// tasks, events and replies. Nothing is written yet.
func (w *worker) prepare(ctx context.Context, jt *jobTurn, now time.Time) {
	jt.settle = make([]settlement, len(jt.inputs))
	// Submissions are parsed first: a rejected one needs no job state.
	needState := false
	for k := range jt.inputs {
		in := &jt.inputs[k]
		if in.kind == inResult && !protocol.ValidToken(jt.id) {
			w.refuseResultForNoJob(jt, k)
			continue
		}
		if in.kind == inSubmit && in.tooLarge > 0 {
			w.s.rejectSubmission(jt, k, &spec.ValidationError{Reason: spec.ReasonTooLarge,
				Msg: "the job's record would be larger than the server takes in one message (max_payload): submit smaller params, or lower max_spec_bytes"})
			continue
		}
		if in.kind == inSubmit && in.spec == nil {
			sp, err := w.s.parseSubmission(in)
			if err == nil {
				err = w.s.checkRateLimits(sp)
			}
			if err != nil {
				w.s.rejectSubmission(jt, k, err)
				continue
			}
			in.spec = sp
			// A job that starts later waits in a message schedule, not here.
			delayed, err := w.s.delaySubmission(ctx, in, sp)
			if err != nil {
				jt.err = err
				return
			}
			if delayed {
				w.s.replyTo(jt, *in, protocol.SubmitReply{JobID: in.job})
				jt.settle[k].term = "delayed: held in WARDEN_DELAY, submitted again when due"
				continue
			}
		}
		needState = true
	}
	if !needState {
		return
	}
	created := false
	js := w.cache[jt.id]
	if js == nil {
		var err error
		jt.fresh = true
		js, created, err = w.load(ctx, jt, now)
		if err != nil {
			jt.err = err
			return
		}
		if js == nil { // unknown job: every input was answered
			return
		}
		w.cache[jt.id] = js
	}
	jt.js = js
	w.endedElsewhere(jt, now)
	for k := range jt.inputs {
		in := &jt.inputs[k]
		switch {
		case jt.settle[k].term != "":
		case in.kind == inSubmit:
			w.s.acceptSubmission(jt, k, created)
			created = false // a second copy in the same turn is a resubmission
		case in.kind == inResult:
			w.applyResult(jt, k, now)
		}
		if jt.reload {
			// Re-apply every input of the turn to the stored job.
			jt.err = fmt.Errorf("job %s: cached records disagree with a result: %w", jt.id, jobstore.ErrConflict)
			return
		}
	}
	if js.job.State.Terminal() {
		// Nothing to dispatch, seal or take back: a finished job's steps
		// are all ended (finishReopen reopens one that has a step pending).
		// A resubmission of its id registered on arrival waits for nothing.
		w.forgetArrived(jt)
		jt.rounds = js.writes(w.s.store)
		return
	}
	w.timeOut(jt, now)           // timeout.go: a job past its timeout is cancelled, to end failed
	w.startCompensation(jt, now) // compensate.go: a job that failed for good undoes its steps
	w.dispatch(jt, now)
	// The dispatch may have ended the job's last open step itself (a
	// cancel of a pending step, an unknown action): its compensation
	// starts now, or the job ended cancelled or failed with nothing undone.
	if w.startCompensation(jt, now) {
		w.dispatch(jt, now)
	}
	if js.open == 0 && js.createsSteps() {
		jt.more = true // it ends in the next turn, after its records exist
	} else if !js.settleExpiry() {
		jt.more = true // its records' TTL goes on in a later turn; the job ends then
	} else if js.settle(now) {
		if st := js.job.State; st == jobstore.JobCompensated || st == jobstore.JobCompensationFailed {
			ev := protocol.Event{Kind: protocol.EventJobCompensationEnded, ID: js.job.ID, JobID: js.job.ID,
				Reason: js.job.Error, Data: map[string]string{"state": string(st)}}
			jt.events = append(jt.events, outEvent{Event: ev, dedup: "end", write: -1})
		}
		jt.finished = true
		state := string(js.job.State)
		jt.count(-1, Metrics.JobFinished, state)
		w.s.logFinished(js.job)
	}
	jt.rounds = js.writes(w.s.store)
}

// load builds a job's state: from the first input's spec for a new job
// (no read), else from the store in one or two reads. A nil state with a
// nil error means the job does not exist and the inputs were answered.
func (w *worker) load(ctx context.Context, jt *jobTurn, now time.Time) (*jobState, bool, error) {
	for k, in := range jt.inputs {
		if in.kind == inSubmit && jt.settle[k].term == "" {
			if in.tries > 0 {
				break // its create found the job: read it
			}
			js, err := w.s.newJobState(jt.id, in.spec, now)
			return js, err == nil, err
		}
	}
	lctx, cancel := context.WithTimeout(ctx, w.s.cfg.WriteTimeout.Std())
	defer cancel()
	snap, err := w.s.store.LoadOnce(lctx, jt.id) // a conflict puts the inputs back (turn)
	if errors.Is(err, jobstore.ErrNotFound) {
		for k, in := range jt.inputs {
			switch {
			case jt.settle[k].term != "":
			case in.kind == inSubmit && in.spec != nil:
				// It existed a moment ago (the create said so) and is gone
				// now (expired): create it again.
				js, err := w.s.newJobState(jt.id, in.spec, now)
				return js, err == nil, err
			}
		}
		w.unknownJob(jt)
		jt.gone = true
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	js, err := newJobState(snap, now, true)
	if errors.Is(err, errPartial) {
		js, err = w.s.completeJobState(snap, now)
	}
	if err == nil {
		w.republish(jt, js, now)
	}
	return js, false, err
}

// unknownJob answers every input of a job the store does not have.
func (w *worker) unknownJob(jt *jobTurn) {
	for k, in := range jt.inputs {
		if in.kind == inResult {
			r, _, _, _ := decodeResult(in.msg) // what it names, for the event
			w.s.rejectResult(jt, k, reasonUnknownJob, fmt.Errorf("no job %s", jt.id), r)
			continue
		}
		jt.settle[k].term = "unknown job"
	}
}

// refuseResultForNoJob refuses a result whose subject names a job id
// that is not a token: no job has it, and the store is not asked.
func (w *worker) refuseResultForNoJob(jt *jobTurn, k int) {
	r, _, reason, err := decodeResult(jt.inputs[k].msg)
	if reason == "" {
		reason, err = reasonUnknownJob, fmt.Errorf("no job %q: a job id may contain only letters, digits, '_' and '-'", clipID(jt.id))
	}
	w.s.rejectResult(jt, k, reason, err, r)
}

// newJobState builds the records of a freshly submitted job, all to be
// created. A job of one step keeps it inline in the job record: one write
// per change instead of two.
func (s *Scheduler) newJobState(id string, sp *spec.Job, now time.Time) (*jobState, error) {
	job := jobstore.NewJob(id, *sp, now)
	steps, err := jobstore.NewSteps(id, *sp, s.stepDefaults(), now)
	if err != nil {
		return nil, err
	}
	job.Inline = len(steps) == 1
	snap := &jobstore.Snapshot{Job: job, Steps: steps, Revs: map[string]uint64{}}
	js, err := newJobState(snap, now, true)
	if err != nil {
		return nil, err
	}
	js.dirtyJob = true
	for i := range js.steps {
		js.markGuarded(i) // created after the job record, its idempotency guard
	}
	return js, nil
}

// completeJobState fills in the step records a dead scheduler did not
// create, to be created now (but for a job that ended: see ended).
func (s *Scheduler) completeJobState(snap *jobstore.Snapshot, now time.Time) (*jobState, error) {
	all, err := s.stepRecords(snap.Job, now)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, st := range snap.Steps {
		have[st.ID] = true
	}
	// A job that ended had all its records; one missing now expired with
	// the retention, a moment ahead of the job's own (written after it).
	// It is not created again, pending: a finished job with a pending step
	// is a reopen to finish (finishReopen), and the step would run again.
	ended := snap.Job.State.Terminal()
	var missing []int
	for i, st := range all {
		if !have[st.ID] {
			if ended {
				st.State, st.LastError, st.FinishedAt = jobstore.StepSucceeded, "record expired with the job's retention", now
			}
			snap.Steps = append(snap.Steps, st)
			missing = append(missing, i)
		}
	}
	js, err := newJobState(snap, now, !ended)
	if err != nil || ended {
		return js, err
	}
	for _, i := range missing {
		js.markGuarded(i)
	}
	return js, nil
}

// stepRecords builds the records of job's steps as they were created: its
// forward steps at its creation, its undo steps (a compensating job's
// spec names them after ForwardSteps) as startCompensation makes them, at
// now and from their own specs. Built with the job's, an undo step whose
// record a dead scheduler did not create got the job's ttl and retry
// settings from its creation: after a forward step expired under that
// ttl, the undo expired unrun too, and the job ended compensation_failed
// with nothing undone.
func (s *Scheduler) stepRecords(job *jobstore.Job, now time.Time) ([]*jobstore.Step, error) {
	if job.ForwardSteps <= 0 || job.ForwardSteps > len(job.Spec.Steps) {
		return jobstore.NewSteps(job.ID, job.Spec, s.stepDefaults(), job.CreatedAt)
	}
	forward := job.Spec
	forward.Steps = job.Spec.Steps[:job.ForwardSteps]
	recs, err := jobstore.NewSteps(job.ID, forward, s.stepDefaults(), job.CreatedAt)
	if err != nil {
		return nil, err
	}
	undo, err := s.undoRecords(job.ID, job.Spec.Steps[job.ForwardSteps:], now)
	if err != nil {
		return nil, err
	}
	return append(recs, undo...), nil
}

// undoRecords builds the records of a compensation's undo steps at now:
// from their own specs, not the job's (no job ttl, expiry or retry
// settings: an undo runs however late its compensation starts).
func (s *Scheduler) undoRecords(jobID string, undo []spec.Step, now time.Time) ([]*jobstore.Step, error) {
	return jobstore.NewSteps(jobID, spec.Job{Steps: undo}, s.stepDefaults(), now)
}

func (s *Scheduler) stepDefaults() jobstore.StepDefaults {
	return jobstore.StepDefaults{Timeout: s.cfg.DefaultStepTimeout.Std(), Retry: &s.retry.Policies,
		Expiry: s.cfg.DefaultTaskExpiry.Std()}
}

func (s *Scheduler) logFinished(job *jobstore.Job) {
	e := s.log.Info()
	if job.State != jobstore.JobSucceeded {
		e = s.log.Warn().Str("error", job.Error)
	}
	e.Str(logging.FieldJob, job.ID).Str("state", string(job.State)).Dur("duration", job.FinishedAt.Sub(job.CreatedAt)).
		Msg("job finished")
}

// republishWithin is how recent a dispatch must be for its task to be
// published again on a re-read: inside the task stream's 2 min duplicate
// window, so that a task that was stored is stored only once.
const republishWithin = 90 * time.Second

// republish queues the tasks of the job's recent dispatches again. A
// scheduler that dies between writing a dispatch and publishing its task
// leaves a step that would wait for its whole lease; the next owner reads
// the job and publishes the task (the same Nats-Msg-Id, so a task that was
// stored is dropped as a duplicate).
//
// How recent is judged by the dispatch of the step's current epoch
// (dispatchedAt), never by the record's updated_at: a cancel writes that
// too, and a step cancelled more than the duplicate window after its
// dispatch had its task published again, stored as a new message, and run
// a second time by an agent that took it for a fresh delivery. A step or
// job to be cancelled gets no task again either way (but a compensation,
// which runs under a cancelled job, does).
func (w *worker) republish(jt *jobTurn, js *jobState, now time.Time) {
	if js.job.StopsSteps() {
		return // its steps are being stopped (cancel); a compensation's run
	}
	for i, st := range js.steps {
		if st.State != jobstore.StepDispatched || st.Desired == jobstore.StepCancelled || st.Token == "" || st.Actor == "" {
			continue
		}
		if at, ok := dispatchedAt(st); !ok || now.Sub(at) > republishWithin {
			continue
		}
		jt.tasks = append(jt.tasks, task{idx: i, msg: w.s.taskMsg(st, st.Pool, st.Actor, st.Token), republish: true})
	}
}

// dispatchedAt is when the step's current epoch was dispatched: its
// attempt's started_at, which Dispatch sets and only the epoch's result
// changes. ok is false when the record keeps no attempt for the epoch.
func dispatchedAt(st *jobstore.Step) (time.Time, bool) {
	for k := len(st.Attempts) - 1; k >= 0; k-- {
		if a := st.Attempts[k]; a.Epoch == st.Epoch {
			return a.StartedAt, !a.StartedAt.IsZero()
		}
	}
	return time.Time{}, false
}

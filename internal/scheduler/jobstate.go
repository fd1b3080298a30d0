package scheduler

import (
	"fmt"
	"slices"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
)

// jobState is a job as its owning worker keeps it between inputs: the
// records it last wrote or read with their revisions, and the DAG
// bookkeeping that lets a result touch only its step and its direct
// dependents. A failed compare-and-set is the signal that someone else
// wrote: the worker drops the state and reloads.
type jobState struct {
	job    *jobstore.Job
	jobRev uint64
	steps  []*jobstore.Step // spec order
	byID   map[string]int
	revs   []uint64 // revision of each step's record (inline: unused)
	// dependents[i] are the steps that depend on step i; waitingOn[i]
	// counts step i's dependencies that have not succeeded.
	dependents [][]int
	waitingOn  []int
	// open counts steps not yet terminal.
	open int
	// ready holds pending steps whose dependencies all succeeded, in the
	// order they became ready; dispatching takes from the front.
	ready []int
	// blocked holds the ready steps the current dispatch round tried and
	// could not place (no agent, the job's share, a gate, a backoff), and
	// blockedWait and blockedAgent what they wait for. The round goes on
	// to the steps behind them; they are ready again when it ends
	// (dispatch.go).
	blocked      []int
	blockedWait  time.Duration
	blockedAgent bool
	// strays are the revisions of step records the spec does not name:
	// compensation steps whose records landed while the job record that
	// adds them to the spec did not (written by versions that created
	// them before that job record: writeRound). startCompensation writes
	// over them rather than creating them again, which failed with
	// "exists" on every reload: the job never moved.
	strays map[string]uint64

	// expiring[i] says step i's record carries the retention TTL (as read,
	// or as this turn writes it), and nexpiring counts them: exactly when
	// every step has ended, and a slice a turn (settleExpiry).
	expiring  []bool
	nexpiring int

	dirtyJob   bool
	dirtySteps map[int]bool
	// rounds holds the write round of the steps not written in the first
	// (writes): what another step's change caused, what the job record's
	// write guards. Cleared with the dirty marks.
	rounds map[int]writeRound
	// used is the worker turn that last used the state (cache eviction).
	used uint64
}

// newJobState builds a job's state from its records. reopen says a
// finished job with a step pending is an operator's reopen to finish
// (finishReopen); it is false when the pending steps are stand-ins for
// records that expired (completeJobState).
func newJobState(snap *jobstore.Snapshot, now time.Time, reopen bool) (*jobState, error) {
	j := snap.Job
	js := &jobState{job: j, jobRev: snap.JobRev, byID: make(map[string]int, len(j.Spec.Steps)),
		dirtySteps: map[int]bool{}, rounds: map[int]writeRound{}}
	have := make(map[string]*jobstore.Step, len(snap.Steps))
	for _, st := range snap.Steps {
		have[st.ID] = st
	}
	js.steps = make([]*jobstore.Step, len(j.Spec.Steps))
	js.revs = make([]uint64, len(j.Spec.Steps))
	js.expiring = make([]bool, len(j.Spec.Steps))
	for i, sp := range j.Spec.Steps {
		js.byID[sp.ID] = i
		js.steps[i] = have[sp.ID]
		js.revs[i] = snap.Revs[sp.ID]
		js.setExpiring(i, snap.Expiring[sp.ID])
	}
	for i, st := range js.steps {
		if st == nil {
			return nil, fmt.Errorf("job %s: step %s has no record: %w", j.ID, j.Spec.Steps[i].ID, errPartial)
		}
	}
	for id, rev := range snap.Revs {
		if _, ok := js.byID[id]; !ok && !j.Inline {
			if js.strays == nil {
				js.strays = map[string]uint64{}
			}
			js.strays[id] = rev
		}
	}
	if reopen {
		js.finishReopen(now)
	}
	js.index(now)
	return js, nil
}

// finishReopen completes an operator's reopen (dlq retry, job retry) that
// the store holds only in part (dlq.RetryJob finishes its own too): a finished
// job with a step pending again (the reopen wrote the step, and its job
// write failed) runs again, and a skipped step none of whose dependencies
// ended without success (a reopen's write of it lost a race) is pending
// again. Left as they were, the first step was dispatched for a finished
// job that never ended again, and the second never ran while its job
// ended succeeded. A compensated job is not reopened (dlq refuses to).
func (js *jobState) finishReopen(now time.Time) {
	j := js.job
	if j.State.Compensation() {
		// A forward step pending here was reopened as the compensation
		// began or ended (the reopen raced dlq's refusal): it would run
		// beside the undo, or wait for ever in a finished job. It ends
		// cancelled; in a finished job its record gets the retention.
		for i := range min(j.ForwardSteps, len(js.steps)) {
			if st := js.steps[i]; st.State == jobstore.StepPending {
				st.State, st.Desired, st.UpdatedAt, st.FinishedAt = jobstore.StepCancelled, jobstore.StepCancelled, now, now
				st.LastError = protocol.ErrorCancelled + ": reopened after its job's compensation began; not run"
				js.markStep(i)
				js.setExpiring(i, j.State.Terminal())
			}
		}
		return
	}
	if j.State.Terminal() {
		if !slices.ContainsFunc(js.steps, func(st *jobstore.Step) bool { return st.State == jobstore.StepPending }) {
			return
		}
		j.Reopen(now)
		js.dirtyJob = true
	}
	for revived := true; revived; {
		revived = false
		for i, st := range js.steps {
			if st.State != jobstore.StepSkipped || slices.ContainsFunc(st.DependsOn, js.failedStep) {
				continue
			}
			st.State, st.FinishedAt, st.LastError, st.UpdatedAt = jobstore.StepPending, time.Time{}, "", now
			js.markStep(i)
			revived = true
		}
	}
}

// failedStep reports whether step id ended without success.
func (js *jobState) failedStep(id string) bool {
	i, ok := js.byID[id]
	return ok && js.steps[i].State.Terminal() && js.steps[i].State != jobstore.StepSucceeded
}

// index derives the DAG bookkeeping from the step states, and skips the
// pending steps a dependency that ended without success blocks for good
// (someone else ended it: an operator, the supervisor's dead letter).
func (js *jobState) index(now time.Time) {
	n := len(js.steps)
	js.dependents = make([][]int, n)
	js.waitingOn = make([]int, n)
	js.open, js.ready = 0, js.ready[:0]
	js.blocked, js.blockedWait, js.blockedAgent = js.blocked[:0], 0, false
	for i, st := range js.steps {
		for _, d := range st.DependsOn {
			di, ok := js.byID[d]
			if !ok {
				continue
			}
			js.dependents[di] = append(js.dependents[di], i)
			if js.steps[di].State != jobstore.StepSucceeded {
				js.waitingOn[i]++
			}
		}
		if !st.State.Terminal() {
			js.open++
		}
	}
	for i, st := range js.steps {
		if st.State == jobstore.StepPending && js.waitingOn[i] == 0 {
			js.ready = append(js.ready, i)
		}
	}
	for i, st := range js.steps {
		if st.State.Terminal() && st.State != jobstore.StepSucceeded {
			js.skipDependents(i, now)
		}
	}
}

func (js *jobState) markStep(i int) {
	if js.job.Inline {
		js.dirtyJob = true
		return
	}
	js.dirtySteps[i] = true
}

// markDerived marks step i dirty with a change another step's change
// caused: it is written after that one has landed (writes).
func (js *jobState) markDerived(i int) {
	js.markStep(i)
	js.writeIn(i, roundDerived)
}

// markGuarded marks step i, created in this turn, dirty: it is written
// after the job record that names it (writes).
func (js *jobState) markGuarded(i int) {
	js.markStep(i)
	js.writeIn(i, roundGuarded)
}

// writeIn says step i's write of this turn, if it has one, goes in round
// r or a later one.
func (js *jobState) writeIn(i int, r writeRound) {
	if !js.job.Inline && js.rounds[i] < r {
		js.rounds[i] = r
	}
}

// createsSteps says the turn creates step records (a new job's, a
// compensation's): the job cannot end in it, since its terminal record
// would land ahead of them (writes); it ends in the next turn.
func (js *jobState) createsSteps() bool {
	for i := range js.dirtySteps {
		if js.rounds[i] == roundGuarded {
			return true
		}
	}
	return false
}

// stepEnded updates the bookkeeping after step i reached a terminal state
// (its record is already changed and marked dirty).
func (js *jobState) stepEnded(i int, now time.Time) {
	js.open--
	if js.steps[i].State == jobstore.StepSucceeded {
		for _, d := range js.dependents[i] {
			js.waitingOn[d]--
			if js.waitingOn[d] == 0 && js.steps[d].State == jobstore.StepPending {
				js.ready = append(js.ready, d)
				// Its dispatch in this turn waits for this success to land:
				// judged on a stale copy, the success may lose its write.
				js.writeIn(d, roundDerived)
			}
		}
		return
	}
	js.skipDependents(i, now)
}

// skipDependents skips every pending step that transitively depends on
// step i.
func (js *jobState) skipDependents(i int, now time.Time) {
	for _, d := range js.dependents[i] {
		st := js.steps[d]
		if st.State != jobstore.StepPending {
			continue
		}
		st.State = jobstore.StepSkipped
		st.LastError = "a dependency did not succeed"
		st.UpdatedAt, st.FinishedAt = now, now
		js.markDerived(d)
		js.open--
		js.skipDependents(d, now)
	}
}

// nextReady removes and returns the first ready step still pending.
func (js *jobState) nextReady() (int, bool) {
	for len(js.ready) > 0 {
		i := js.ready[0]
		js.ready = js.ready[1:]
		if js.steps[i].State == jobstore.StepPending && js.waitingOn[i] == 0 {
			return i, true
		}
	}
	return 0, false
}

// settle records the job state the steps imply once nothing is open, and
// reports whether the job just ended.
func (js *jobState) settle(now time.Time) bool {
	j := js.job
	if j.State.Terminal() {
		return false
	}
	if js.open > 0 {
		if j.State == jobstore.JobPending && js.anyStarted() {
			j.State, j.UpdatedAt = jobstore.JobRunning, now
			js.dirtyJob = true
		}
		return false
	}
	if j.State == jobstore.JobCompensating {
		return js.endCompensation(now)
	}
	failed, expired := firstFailures(js.steps)
	cancelled := slices.ContainsFunc(js.steps, func(st *jobstore.Step) bool { return st.State == jobstore.StepCancelled })
	switch {
	case j.TimedOut && (!js.cancelStoppedNothing() || cancelled):
		// A step that had failed for good is named too: the job was
		// failing already when its timeout cut the rest short.
		j.State, j.Error = jobstore.JobFailed, j.TimeoutError()
		if failed != "" {
			j.Error += "; before it, " + failed
		}
	case j.Desired == jobstore.JobCancelled && !js.cancelStoppedNothing() || cancelled:
		// A cancel that stopped nothing (every step had succeeded, or
		// succeeded anyway: it raced the last result) leaves the job
		// succeeded, as a cancel of a finished job is refused.
		j.State = jobstore.JobCancelled
	case failed != "":
		j.State, j.Error = jobstore.JobFailed, failed
	case expired != "":
		j.State, j.Error = jobstore.JobExpired, expired
	default:
		j.State = jobstore.JobSucceeded
	}
	j.UpdatedAt, j.FinishedAt = now, now
	js.dirtyJob = true
	return true
}

// sealSlice is how many step records one turn writes again to seal a
// job: all of a 1,000-step job's in the turn it ended made that turn
// 65 ms long, and the single-step jobs of the same worker waited behind
// it (probe p99 during a fan-out 26-30 ms against 12-16).
const sealSlice = 64

// settleExpiry makes the step records of the job carry the retention TTL
// exactly when every step has ended, before its terminal record is
// written: the retention runs from the job's end for every record of it,
// however long the job was open (jobstore.EndedStepWrite), and no record
// expires while its job can still read it. A job whose steps open again
// (compensation starts, a cancel with compensation or a dlq retry came
// while it ended) takes the TTL back: a finished step whose record is gone
// is taken for one never created and run again. A turn marks at most
// sealSlice records it would not write anyway; done says none is left,
// and the job may end in this turn if its steps have.
func (js *jobState) settleExpiry() (done bool) {
	want, target := js.open == 0, 0
	if want {
		target = len(js.steps)
	}
	if js.job.Inline || js.nexpiring == target {
		return true // every record as it should be: nothing to walk
	}
	extra := 0
	for i := range js.steps {
		if js.expiring[i] == want {
			continue
		}
		if !js.dirtySteps[i] {
			if extra == sealSlice {
				return false
			}
			extra++
			js.markStep(i)
		}
		js.setExpiring(i, want)
	}
	return true
}

// setExpiring records whether step i's record carries the retention TTL.
func (js *jobState) setExpiring(i int, e bool) {
	if js.expiring[i] != e {
		js.expiring[i] = e
		if e {
			js.nexpiring++
		} else {
			js.nexpiring--
		}
	}
}

// cancelStoppedNothing reports whether a cancel of the job reached none of
// its steps: every step succeeded, and none was told to stop (desired
// cancelled: a cancel marks every step it finds unfinished). Such a
// cancel raced the last result, and a cancel of the finished job would
// have been refused.
func (js *jobState) cancelStoppedNothing() bool {
	return !slices.ContainsFunc(js.steps, func(st *jobstore.Step) bool {
		return st.State != jobstore.StepSucceeded || st.Desired == jobstore.StepCancelled
	})
}

// inFlight counts the job's dispatched steps.
func (js *jobState) inFlight() int {
	n := 0
	for _, st := range js.steps {
		if st.State == jobstore.StepDispatched {
			n++
		}
	}
	return n
}

func (js *jobState) anyStarted() bool {
	for _, st := range js.steps {
		if st.State != jobstore.StepPending {
			return true
		}
	}
	return false
}

// writeRound is when a write of a turn lands: a round is written only
// once every write of the one before it has landed.
type writeRound int

const (
	// roundOwn: the steps' own changes (a result applied, a dispatch).
	roundOwn writeRound = iota
	// roundDerived: what they caused (dependents skipped, or dispatched
	// after a success). When a cause's compare-and-set loses (the cached
	// copy was stale: the step moved on elsewhere), its effects are not
	// written at all: written beside it, they landed without it, and a
	// skipped dependent went back to pending when the job was read again
	// (or ran while its dependency was still running).
	roundDerived
	// roundJob: the job record. Its terminal record is the completion
	// signal, so it never runs ahead of its steps'.
	roundJob
	// roundGuarded: step records created in the turn (a new job's, a
	// compensation's undo steps), after the job record that names them:
	// it is their idempotency guard. Without it, an undo step created
	// for a compensation whose job record lost its write was dispatched
	// and ran for a job that never compensated.
	roundGuarded
	nRounds
)

// writeRounds are a turn's writes of one job, its rounds in order, the
// empty ones left out: a turn writes every job's first round side by side,
// then every job's second, so a job waits for no round trip it does not
// need (an inline job has one round, its record). idx names what each
// write is: a step's index, or -1 for the job record.
type writeRounds struct {
	writes [nRounds][]jobstore.Write
	idx    [nRounds][]int
	n      int // the rounds with writes: writes[:n]
}

// writes returns the records to write for what changed, by round
// (writeRound), and clears the dirty marks. A step whose record carries
// the retention TTL is written with it (settleExpiry).
func (js *jobState) writes(st *jobstore.Store) writeRounds {
	var r writeRounds
	writes, idx := &r.writes, &r.idx
	if !js.job.Inline {
		for i := range js.dirtySteps {
			var w jobstore.Write
			if js.expiring[i] {
				w = st.EndedStepWrite(js.steps[i], js.revs[i])
			} else {
				w = st.StepWrite(js.steps[i], js.revs[i])
			}
			k := max(roundOwn, js.rounds[i]) // a later round if another's change caused it
			writes[k] = append(writes[k], w)
			idx[k] = append(idx[k], i)
		}
	}
	clear(js.dirtySteps)
	clear(js.rounds)
	if js.dirtyJob {
		if js.job.Inline {
			js.job.Steps = js.steps
		}
		writes[roundJob], idx[roundJob] = []jobstore.Write{st.JobWrite(js.job, js.jobRev)}, []int{-1}
		js.dirtyJob = false
	}
	// The empty rounds are left out: the others move to the front, in order.
	for k := range nRounds {
		if len(writes[k]) > 0 {
			writes[r.n], idx[r.n] = writes[k], idx[k]
			r.n++
		}
	}
	for k := r.n; k < int(nRounds); k++ {
		writes[k], idx[k] = nil, nil
	}
	return r
}

package jobstore

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/wardenhq/warden/pkg/protocol"
)

// TokenMatches reports whether token is the current dispatch's lease token.
// A step dispatched before tokens existed (none recorded) accepts any token.
func (s *Step) TokenMatches(token string) bool {
	return s.Token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(s.Token)) == 1
}

// ErrStale is returned when a result's epoch does not match the step's
// current epoch, or the step is not waiting for a result: the result comes
// from an agent that no longer holds the step and must be dropped.
var ErrStale = errors.New("stale result")

// Dispatch moves a pending step to dispatched on agent: a new epoch, the
// actor and the lease. The caller writes the record (CAS) before it
// publishes the task, so a task never exists for an epoch the store lacks.
func (s *Step) Dispatch(agent, token string, now time.Time, grace time.Duration) error {
	if s.State != StepPending {
		return fmt.Errorf("dispatch step %s.%s: state is %s, not pending", s.JobID, s.ID, s.State)
	}
	s.Epoch++
	s.Attempt++
	s.State = StepDispatched
	s.Actor = agent
	s.Token = token
	s.Waiting = ""
	s.NotBefore = time.Time{}
	s.LockedUntil = now.Add(s.Timeout.Std() + grace)
	s.UpdatedAt = now
	s.Attempts = append(s.Attempts, Attempt{Epoch: s.Epoch, Agent: agent, StartedAt: now, Status: string(StepDispatched)})
	if n := len(s.Attempts); n > MaxAttempts {
		// Only the latest: a step retried or taken back without end (a
		// reroute does not count as an attempt) must not outgrow a message.
		s.Attempts = append(s.Attempts[:0], s.Attempts[n-MaxAttempts:]...)
	}
	return nil
}

// A step record must stay well inside the server's max_payload (1 MiB by
// default) however its step fails: an agent's error text may be as long as
// its max_result_bytes (256 KiB), escaping can make it six times longer
// stored, and every dispatch adds an attempt. A record that outgrew the
// limit could no longer be written: its result was redelivered forever.
const (
	// MaxFreeReroutes is how many refusals in a row by members of its
	// cluster a step is routed again after without counting an attempt
	// (about 5 s of refusals at the scheduler's reroute delay): enough for
	// a router's view to catch up with a leadership change. Past it a
	// refusal counts as a retriable failure, so that a member refusing
	// for good (a definition it cannot read) ends the step through its
	// retries instead of routing it four times a second for ever.
	MaxFreeReroutes = 20
	// MaxAttempts is how many of a step's latest dispatches its record
	// keeps (Attempts; their epochs say which).
	MaxAttempts = 50
	// MaxAttemptErrorBytes bounds an attempt's error text.
	MaxAttemptErrorBytes = 1024
	// MaxLastErrorBytes bounds a step's last_error.
	MaxLastErrorBytes = 8192
)

// clip shortens s to at most n bytes (on a character boundary), saying how
// much was cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := runeStart(s, n-32) // room for the note
	return s[:cut] + fmt.Sprintf("… (%d bytes cut)", len(s)-cut)
}

// Clip shortens s to at most n bytes and an ellipsis, on a rune boundary:
// text quoted back or listed (an id that is not a token, a dead letter's
// error in a listing) without the note clip adds.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:runeStart(s, n)] + "…"
}

// runeStart is the last index at or before n where a rune of s starts.
func runeStart(s string, n int) int {
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return n
}

// Outcome is what applying a result did to a step.
type Outcome int

// Outcomes of ApplyResult.
const (
	// OutcomeSucceeded: the step succeeded.
	OutcomeSucceeded Outcome = iota + 1
	// OutcomeRetry: the step failed and went back to pending for another attempt.
	OutcomeRetry
	// OutcomeFailed: the step failed for good.
	OutcomeFailed
)

// ApplyResult records an agent's result. retriable says whether a failure
// may be retried (the caller classifies it); a retriable failure with
// attempts left sends the step back to pending. A result for another epoch,
// or for a step that is not dispatched, returns ErrStale and changes nothing.
func (s *Step) ApplyResult(r protocol.Result, retriable bool, now time.Time) (Outcome, error) {
	if r.Epoch != s.Epoch || s.State != StepDispatched || !s.TokenMatches(r.Token) {
		return 0, fmt.Errorf("%w: step %s.%s is %s at epoch %d, result is for epoch %d from %s",
			ErrStale, s.JobID, s.ID, s.State, s.Epoch, r.Epoch, r.Agent)
	}
	s.UpdatedAt = now
	freeReroute := s.FreeReroute(r)
	if n := len(s.Attempts); n > 0 && s.Attempts[n-1].Epoch == s.Epoch {
		a := &s.Attempts[n-1]
		if !r.StartedAt.IsZero() {
			a.StartedAt = r.StartedAt
		}
		a.FinishedAt = r.FinishedAt
		a.Agent = r.Agent
		a.Status = r.Status
		a.Error = clip(r.Error, MaxAttemptErrorBytes)
		a.Class = r.ErrorClass
	}
	s.LockedUntil = time.Time{}
	if freeReroute {
		// A cluster member refused the task (docs/clusters.md): it ran
		// nothing, so this dispatch is not an attempt; route it again.
		s.State, s.Actor, s.LastError = StepPending, "", clip(r.Error, MaxLastErrorBytes)
		s.Attempt = max(s.Attempt-1, 0)
		return OutcomeRetry, nil
	}
	if r.Status == protocol.ResultSucceeded {
		s.State = StepSucceeded
		s.Output = r.Output
		s.FinishedAt = now
		return OutcomeSucceeded, nil
	}
	s.ErrorCount++
	s.LastError = clip(r.Error, MaxLastErrorBytes)
	if s.Desired == StepCancelled {
		s.State = StepCancelled
		s.FinishedAt = now
		return OutcomeFailed, nil
	}
	if retriable && s.Attempt <= s.MaxRetries {
		s.State = StepPending
		s.Actor = ""
		return OutcomeRetry, nil
	}
	s.State = StepFailed
	s.FinishedAt = now
	return OutcomeFailed, nil
}

// Release takes a dispatched step back from its agent so that it can be
// dispatched again with a new epoch: its lease expired or its agent failed.
// status names why in the retry chain ("lease_expired", "transferred").
// suspect says the step was in flight when its agent failed, so it counts
// towards the poison threshold; a task that only waited in a dead agent's
// queue did nothing wrong.
func (s *Step) Release(status, reason string, suspect bool, now time.Time) error {
	if s.State != StepDispatched {
		return fmt.Errorf("release step %s.%s: state is %s, not dispatched", s.JobID, s.ID, s.State)
	}
	s.EndAttempt(status, reason, now)
	if status == "transferred" {
		s.TransferredFrom = s.Actor
	}
	if suspect {
		s.Recoveries++
	}
	s.State = StepPending
	s.Actor = ""
	s.Token = ""
	s.LockedUntil = time.Time{}
	s.LastError = reason
	s.UpdatedAt = now
	// A recovery is not the step's fault; it keeps its retry budget.
	s.Attempt--
	return nil
}

// EndAttempt ends the current dispatch's attempt (the latest, if it is
// the current epoch's) with status and reason (clipped) at now. An attempt
// already ended keeps its end: a transfer's give-up records its own before
// it parks the step. Every path that ends a dispatch without its result
// (release, dead letter, a cancel the agent never confirmed, a transfer
// given up) ends its attempt here.
func (s *Step) EndAttempt(status, reason string, now time.Time) {
	if n := len(s.Attempts); n > 0 && s.Attempts[n-1].Epoch == s.Epoch && s.Attempts[n-1].FinishedAt.IsZero() {
		a := &s.Attempts[n-1]
		a.Status, a.Error, a.FinishedAt = status, clip(reason, MaxAttemptErrorBytes), now
	}
}

// DeadLetter parks a step that cannot complete: it exhausted its
// deliveries or keeps killing its agents. A dispatched step's attempt ends
// dead-lettered too, with reason as its error: nothing runs it any more.
func (s *Step) DeadLetter(reason string, now time.Time) {
	if s.State == StepDispatched {
		s.EndAttempt(string(StepDeadLettered), reason, now)
	}
	s.State = StepDeadLettered
	s.LastError = reason
	s.UpdatedAt = now
	s.FinishedAt = now
	s.LockedUntil = time.Time{}
}

// ReasonExpired starts the error of a step that expired before it ran.
const ReasonExpired = "expired"

// Expired reports whether the step's expiry has passed at now.
func (s *Step) Expired(now time.Time) bool {
	return !s.ExpiresAt.IsZero() && now.After(s.ExpiresAt)
}

// FailPastExpiry ends a step that has run (Attempt > 0) and whose next
// attempt cannot start by its expires_at: it fails with its last error,
// which the expiry does not replace, and its job fails (and compensates)
// as for any permanent failure. Its error count already holds that error.
func (s *Step) FailPastExpiry(now time.Time) {
	why := s.LastError
	if why == "" {
		why = "attempt " + strconv.Itoa(s.Attempt) + " ended"
	}
	s.State = StepFailed
	s.LastError = why + " (not retried: its expires_at " + s.ExpiresAt.Format(time.RFC3339) + " passed)"
	s.UpdatedAt, s.FinishedAt = now, now
	s.LockedUntil, s.NotBefore = time.Time{}, time.Time{}
}

// Expire ends a step whose expiry passed before it could start.
func (s *Step) Expire(now time.Time) {
	s.State = StepExpired
	s.LastError = fmt.Sprintf("%s: not started by %s", ReasonExpired, s.ExpiresAt.Format(time.RFC3339))
	s.UpdatedAt = now
	s.FinishedAt = now
	s.LockedUntil = time.Time{}
}

// Fail ends a step that cannot run (no agent offers its action, say).
func (s *Step) Fail(reason string, now time.Time) {
	s.State = StepFailed
	s.LastError = reason
	s.ErrorCount++
	s.UpdatedAt = now
	s.FinishedAt = now
	s.LockedUntil = time.Time{}
}

// Plan is what a job's step states call for next.
type Plan struct {
	// Ready are pending steps whose dependencies all succeeded.
	Ready []*Step
	// Skip are pending steps that can never run: a dependency ended
	// without success.
	Skip []*Step
	// State is the job state the steps imply once Skip is applied.
	State JobState
	// Error names the first step that failed, for a failed job.
	Error string
}

// Evaluate derives the job's next moves from its steps. It is pure: the
// caller writes what it decides.
func Evaluate(steps []*Step) Plan {
	byID := make(map[string]*Step, len(steps))
	for _, s := range steps {
		byID[s.ID] = s
	}
	var p Plan
	// A skipped step makes its own dependents unrunnable too; iterate until
	// nothing changes (bounded by the number of steps).
	blocked := map[string]bool{}
	for changed := true; changed; {
		changed = false
		for _, s := range steps {
			if s.State != StepPending || blocked[s.ID] {
				continue
			}
			for _, d := range s.DependsOn {
				ds := byID[d]
				if ds == nil || blocked[d] || (ds.State.Terminal() && ds.State != StepSucceeded) {
					blocked[s.ID] = true
					changed = true
					break
				}
			}
		}
	}
	active, succeeded := 0, 0
	var failed, cancelled, dispatched bool
	for _, s := range steps {
		switch {
		case blocked[s.ID]:
			p.Skip = append(p.Skip, s)
		case s.State == StepPending:
			active++
			ready := true
			for _, d := range s.DependsOn {
				if byID[d].State != StepSucceeded {
					ready = false
					break
				}
			}
			if ready {
				p.Ready = append(p.Ready, s)
			}
		case s.State == StepDispatched:
			active++
			dispatched = true
		case s.State == StepSucceeded:
			succeeded++
		case s.State == StepCancelled:
			cancelled = true
		default: // failed, dead-lettered, skipped
			if s.State != StepSkipped && p.Error == "" {
				p.Error = fmt.Sprintf("step %s %s: %s", s.ID, s.State, s.LastError)
			}
			failed = true
		}
	}
	switch {
	case active > 0 && (succeeded > 0 || dispatched):
		p.State = JobRunning
	case active > 0:
		p.State = JobPending
	case cancelled:
		p.State = JobCancelled
	case failed:
		p.State = JobFailed
	default:
		p.State = JobSucceeded
	}
	return p
}

// FreeReroute reports whether r, a failed result, is a refusal by a member
// of the step's cluster that sends it to be routed again without counting
// an attempt: the step is a cluster step (a reroute from any other agent
// is a failure like another), not being cancelled, and fewer than
// MaxFreeReroutes of its latest dispatches before this one were refused.
func (s *Step) FreeReroute(r protocol.Result) bool {
	if r.Status == protocol.ResultSucceeded || r.ErrorClass != protocol.ClassReroute || s.Cluster == "" || s.Desired == StepCancelled {
		return false
	}
	refused := 0
	for i := len(s.Attempts) - 1; i >= 0 && refused < MaxFreeReroutes; i-- {
		a := s.Attempts[i]
		if a.Epoch == r.Epoch {
			continue // this dispatch's own, not yet judged
		}
		if a.Class != protocol.ClassReroute {
			break
		}
		refused++
	}
	return refused < MaxFreeReroutes
}

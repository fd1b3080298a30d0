package client

import "github.com/wardenhq/warden/internal/jobstore"

// The job store's records, as Follow, Job and Jobs return them: the JSON
// documents the scheduler keeps in the warden_jobs bucket
// (docs/protocol.md), less each step's lease token (see view). They are
// read-only views here; only the scheduler and the supervisor change them.
type (
	// Job is a job's record: its spec, desired and current state.
	Job = jobstore.Job
	// Step is a step's record: state, epoch, actor, attempts, result.
	Step = jobstore.Step
	// Attempt is one run of a step, in Step.Attempts.
	Attempt = jobstore.Attempt
	// JobState is a job's state; Terminal reports whether it is final.
	JobState = jobstore.JobState
	// StepState is a step's state; Terminal reports whether it is final.
	StepState = jobstore.StepState
)

// Job states.
const (
	JobPending   = jobstore.JobPending
	JobRunning   = jobstore.JobRunning
	JobSucceeded = jobstore.JobSucceeded
	JobFailed    = jobstore.JobFailed
	JobCancelled = jobstore.JobCancelled
	// A job that failed (or was cancelled with compensation) and is
	// undoing its succeeded steps, then its end: every compensation ran,
	// or one failed for good.
	JobCompensating       = jobstore.JobCompensating
	JobCompensated        = jobstore.JobCompensated
	JobCompensationFailed = jobstore.JobCompensationFailed
	// JobExpired: the job had not started by its expires_at / ttl.
	JobExpired = jobstore.JobExpired
)

// Step states.
const (
	StepPending      = jobstore.StepPending
	StepDispatched   = jobstore.StepDispatched
	StepSucceeded    = jobstore.StepSucceeded
	StepFailed       = jobstore.StepFailed
	StepSkipped      = jobstore.StepSkipped
	StepCancelled    = jobstore.StepCancelled
	StepDeadLettered = jobstore.StepDeadLettered
	// StepExpired: the step had not started by its expiry.
	StepExpired = jobstore.StepExpired
)

// The views Job, Jobs and Follow return never carry a step's lease token
// (Step.Token, "token" in the record): only the scheduler and the agent
// holding the task may know it. A result's Nats-Msg-Id contains it
// (protocol.ResultMsgID) and the results stream drops a second message
// with the same id, so whoever read it could publish under that id first:
// the genuine result would come back a duplicate and be lost, and the step
// would stall until its lease ended (docs/security.md). A dispatched step
// shows its lease by its actor and locked_until.

// redactStep clears s's lease token and returns s; the records it is given
// were just decoded for the caller, so no copy is needed.
func redactStep(s *Step) *Step {
	if s != nil {
		s.Token = ""
	}
	return s
}

// redactJob clears the lease tokens of j's inline steps (a one-step job
// keeps its step in the job record) and returns j.
func redactJob(j *Job) *Job {
	if j != nil {
		for _, s := range j.Steps {
			redactStep(s)
		}
	}
	return j
}

package jobstore

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/wardenhq/warden/internal/retry"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// JobState is the state of a job.
type JobState string

// Job states. A job is terminal in succeeded, failed or cancelled.
const (
	JobPending   JobState = "pending"
	JobRunning   JobState = "running"
	JobSucceeded JobState = "succeeded"
	JobFailed    JobState = "failed"
	JobCancelled JobState = "cancelled"
	// Compensation (internal/compensate): a job that failed for good and
	// has steps to undo is compensating until its compensation steps end,
	// then compensated, or compensation_failed if one failed for good.
	JobCompensating       JobState = "compensating"
	JobCompensated        JobState = "compensated"
	JobCompensationFailed JobState = "compensation_failed"
	// JobExpired: a step expired before it could start, none failed, and
	// nothing was to be undone (else the job compensates).
	JobExpired JobState = "expired"
)

// JobStates lists the job states, in lifecycle order.
var JobStates = []JobState{JobPending, JobRunning, JobSucceeded, JobFailed, JobCancelled, JobExpired,
	JobCompensating, JobCompensated, JobCompensationFailed}

// Terminal reports whether no further transition can happen.
func (s JobState) Terminal() bool {
	return s == JobSucceeded || s == JobFailed || s == JobCancelled || s == JobCompensated || s == JobCompensationFailed || s == JobExpired
}

// Compensation reports whether the job's compensation began (it undoes,
// or has undone, its steps): its forward steps are not run again.
func (s JobState) Compensation() bool {
	return s == JobCompensating || s == JobCompensated || s == JobCompensationFailed
}

// StepState is the state of a step.
type StepState string

// Step states. A step is terminal in every state but pending and dispatched.
const (
	StepPending      StepState = "pending"
	StepDispatched   StepState = "dispatched"
	StepSucceeded    StepState = "succeeded"
	StepFailed       StepState = "failed"
	StepSkipped      StepState = "skipped"
	StepCancelled    StepState = "cancelled"
	StepDeadLettered StepState = "dead_lettered"
	// StepExpired: not started by its expires_at; never run late.
	StepExpired StepState = "expired"
)

// Terminal reports whether no further transition can happen without an
// operator (a retry from the dead-letter queue, say).
func (s StepState) Terminal() bool {
	return s != StepPending && s != StepDispatched
}

// Job is the record under job.<id>.
type Job struct {
	ID      string   `json:"id"`
	Name    string   `json:"name"`
	Spec    spec.Job `json:"spec"`
	Desired JobState `json:"desired"`
	State   JobState `json:"state"`
	// Error says why a job failed: the first failed step and its error.
	Error      string    `json:"error,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// Inline says the job's steps live in Steps, inside this record, rather
	// than under step.<job>.<step>: a small job costs one record write per
	// change instead of two (see Layout).
	Inline bool `json:"inline,omitempty"`
	// ForwardSteps, once the job compensates, is how many of Spec.Steps
	// are the job's own: the compensation steps are appended after them.
	ForwardSteps int `json:"forward_steps,omitempty"`
	// CompensateOnCancel: a cancel asked for the succeeded steps to be
	// undone once every step has stopped (client.CancelCompensate).
	CompensateOnCancel bool `json:"compensate_on_cancel,omitempty"`
	// Deadline is when the job's timeout (spec.Job.Timeout) runs out,
	// counted from its acceptance (a reopen starts it again); zero: none.
	// TimedOut: it ran out, and the job is cancelled to end failed.
	Deadline time.Time `json:"deadline,omitzero"`
	TimedOut bool      `json:"timed_out,omitempty"`
	Steps    []*Step   `json:"steps,omitempty"`
}

// Attempt is one execution of a step: the retry chain.
type Attempt struct {
	Epoch      uint64    `json:"epoch"`
	Agent      string    `json:"agent"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	Status     string    `json:"status"`
	Error      string    `json:"error,omitempty"`
	Class      string    `json:"class,omitempty"`
}

// Step is the record under step.<job>.<step>. It copies what dispatch needs
// from the spec so that dispatching never reads the job record.
type Step struct {
	JobID  string          `json:"job_id"`
	ID     string          `json:"id"`
	Action string          `json:"action"`
	Params json.RawMessage `json:"params,omitempty"`
	Pool   string          `json:"pool"`
	Agent  string          `json:"agent,omitempty"`
	// Cluster and Target route the step through an agent cluster; the
	// dispatch records the cluster epoch the task carries.
	Cluster      string            `json:"cluster,omitempty"`
	Target       string            `json:"target,omitempty"`
	ClusterEpoch uint64            `json:"cluster_epoch,omitempty"`
	Requires     []string          `json:"requires,omitempty"`
	DependsOn    []string          `json:"depends_on,omitempty"`
	Timeout      protocol.Duration `json:"timeout"`
	MaxRetries   int               `json:"max_retries"`
	// Retry is the step's own retry override from its spec, if any.
	Retry *retry.Override `json:"retry,omitempty"`
	// NotBefore holds a retry back until its backoff has passed.
	NotBefore time.Time `json:"not_before,omitzero"`
	// ExpiresAt: a step not started by then fails as expired.
	ExpiresAt time.Time `json:"expires_at,omitzero"`

	Desired StepState `json:"desired"`
	State   StepState `json:"state"`
	// Epoch increases with every dispatch; only a result carrying the
	// current epoch may change the step.
	Epoch   uint64 `json:"epoch"`
	Attempt int    `json:"attempt"`
	// Actor is the agent holding the step; LockedUntil is its lease.
	Actor string `json:"actor,omitempty"`
	// Token is the current dispatch's lease token itself, so that a
	// scheduler that takes the job over can publish the task again (same
	// Nats-Msg-Id: stored once) if its first owner died between writing
	// the record and publishing the task. Only the agent named in the
	// result subject may publish a result for it (server permissions).
	Token       string    `json:"token,omitempty"`
	LockedUntil time.Time `json:"locked_until,omitzero"`
	// TransferredFrom names the agent the step was last moved away from.
	TransferredFrom string `json:"transferred_from,omitempty"`
	// Recoveries counts how often the supervisor took the step back from an
	// agent (lease expired, agent failed): a step that keeps killing its
	// agents is poison and is parked past a threshold.
	Recoveries int `json:"recoveries,omitempty"`
	// Waiting says why a ready step has not been dispatched yet.
	Waiting    string          `json:"waiting,omitempty"`
	ErrorCount int             `json:"error_count"`
	LastError  string          `json:"last_error,omitempty"`
	Output     json.RawMessage `json:"output,omitempty"`
	Attempts   []Attempt       `json:"attempts,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	UpdatedAt  time.Time       `json:"updated_at"`
	FinishedAt time.Time       `json:"finished_at,omitzero"`

	// inline is set on steps read from an inline job record: writing one
	// rewrites that record.
	inline bool
}

// Inline reports whether the step lives inside its job's record.
func (s *Step) Inline() bool { return s.inline }

// Inconsistent reports whether the step has not reached its desired state.
func (s *Step) Inconsistent() bool { return s.State != s.Desired }

// NewJob builds the record of a freshly accepted job.
func NewJob(id string, sp spec.Job, now time.Time) *Job {
	j := &Job{ID: id, Name: sp.Name, Spec: sp, Desired: JobSucceeded, State: JobPending, CreatedAt: now, UpdatedAt: now}
	j.setDeadline(now)
	return j
}

// Reopen makes a finished job running again (an operator's retry): its
// end, error and desired state are cleared, and its timeout, if any,
// starts again from now.
func (j *Job) Reopen(now time.Time) {
	j.State, j.Desired, j.Error, j.FinishedAt, j.UpdatedAt = JobRunning, JobSucceeded, "", time.Time{}, now
	j.TimedOut = false
	j.setDeadline(now)
}

func (j *Job) setDeadline(start time.Time) {
	j.Deadline = time.Time{}
	if j.Spec.Timeout > 0 {
		j.Deadline = start.Add(j.Spec.Timeout.Std())
	}
}

// TimeoutPending reports whether j has a timeout that can still act: a
// deadline, and a job neither finished, compensating (its undo runs to
// the end) nor being cancelled (a timeout that acted included).
func (j *Job) TimeoutPending() bool {
	return !j.Deadline.IsZero() && !j.State.Terminal() && j.State != JobCompensating && j.Desired != JobCancelled
}

// CancelRequested reports whether someone cancelled j (an operator, a
// client): a job that timed out is cancelled too, to stop its steps, but
// ends failed, compensates as after any failure, and its dead letters may
// be retried once it has ended.
func (j *Job) CancelRequested() bool { return j.Desired == JobCancelled && !j.TimedOut }

// StopsSteps reports whether j's steps are being stopped: it is to be
// cancelled (an operator, a client, its timeout) and not compensating (a
// compensation's undo runs under a cancelled job). The scheduler cancels
// such a job's steps and publishes none of its tasks again; the
// supervisor ends its steps cancelled rather than re-dispatching them.
func (j *Job) StopsSteps() bool { return j.Desired == JobCancelled && j.State != JobCompensating }

// TimeoutError words the error of a job that ran out of its timeout.
func (j *Job) TimeoutError() string {
	return fmt.Sprintf("timed out: not finished within its timeout of %s", j.Spec.Timeout)
}

// StepDefaults fill what a spec step leaves out.
type StepDefaults struct {
	Timeout time.Duration
	// MaxRetries applies when Retry is nil.
	MaxRetries int
	// Retry resolves each step's max_retries from its action's policy and
	// its own override.
	Retry *retry.Policies
	// Expiry applies to steps without expires_in; zero: no expiry.
	Expiry time.Duration
}

// NewSteps builds the step records of a job from its spec.
func NewSteps(jobID string, sp spec.Job, d StepDefaults, now time.Time) ([]*Step, error) {
	out := make([]*Step, 0, len(sp.Steps))
	for _, s := range sp.Steps {
		s = sp.WithJobRetry(s)
		var params json.RawMessage
		if s.Params != nil {
			b, err := json.Marshal(s.Params)
			if err != nil {
				return nil, &spec.ValidationError{Reason: spec.ReasonInvalidValue, Field: "steps." + s.ID + ".params", Msg: err.Error()}
			}
			params = b
		}
		st := &Step{
			JobID: jobID, ID: s.ID, Action: s.Action, Params: params,
			Pool: s.PoolOrDefault(), Agent: s.Agent, Cluster: s.Cluster, Target: s.Target, Requires: s.Requires, DependsOn: s.DependsOn,
			Timeout: s.Timeout, MaxRetries: d.MaxRetries,
			Desired: StepSucceeded, State: StepPending, CreatedAt: now, UpdatedAt: now,
		}
		if st.Timeout == 0 {
			st.Timeout = protocol.Duration(d.Timeout)
		}
		st.Retry = s.RetryOverride()
		switch {
		case d.Retry != nil:
			st.MaxRetries = d.Retry.Resolve(s.Action, st.Retry).MaxRetries
		case s.MaxRetries != nil:
			st.MaxRetries = *s.MaxRetries
		}
		if at := sp.StepExpiryAt(s, now); !at.IsZero() {
			// expires_at, ttl / expires_in, the job's own expiry (spec).
			st.ExpiresAt = at
		} else if d.Expiry > 0 {
			st.ExpiresAt = now.Add(d.Expiry)
		}
		out = append(out, st)
	}
	return out, nil
}

// Package ops holds operators' actions on a running deployment: cancel or
// retry a job, drain, undrain or fail over an agent. They change the job
// store with the same compare-and-set rules as the scheduler, and reach
// running processes through control subjects (request-reply), so the CLI,
// the HTTP API and programs share one implementation.
package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/pkg/dlq"
	"github.com/wardenhq/warden/pkg/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
)

// ErrFinished: the job is already terminal (it matches dlq.ErrWrongState).
var ErrFinished = fmt.Errorf("%w: job already finished", dlq.ErrWrongState)

// Ops acts on one deployment.
type Ops struct {
	nc    *nats.Conn
	store *jobstore.Store
	now   func() time.Time
}

// New returns operators' actions over nc and store.
func New(nc *nats.Conn, store *jobstore.Store) *Ops {
	return &Ops{nc: nc, store: store, now: time.Now}
}

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

// CancelJob cancels a job: steps not started are cancelled, running ones are
// interrupted through their agent (the handler's context is cancelled), and
// the job ends cancelled once nothing runs.
func (o *Ops) CancelJob(ctx context.Context, jobID string) (CancelReport, error) {
	rep := CancelReport{JobID: jobID}
	if err := o.updateJob(ctx, jobID, func(j *jobstore.Job) error {
		if j.State.Terminal() {
			return fmt.Errorf("%w: %s is %s", ErrFinished, jobID, j.State)
		}
		j.Desired = jobstore.JobCancelled
		return nil
	}); err != nil {
		return rep, err
	}
	job, _, err := o.store.Job(ctx, jobID)
	if err != nil {
		return rep, err
	}
	for _, sp := range job.Spec.Steps {
		var interrupt *jobstore.Step
		err := o.updateStep(ctx, jobID, sp.ID, func(st *jobstore.Step) (bool, error) {
			interrupt = nil
			switch st.State {
			case jobstore.StepPending:
				st.Desired, st.State = jobstore.StepCancelled, jobstore.StepCancelled
				st.LastError, st.FinishedAt = protocol.ErrorCancelled+" by an operator", o.now().UTC()
				return true, nil
			case jobstore.StepDispatched:
				st.Desired = jobstore.StepCancelled
				interrupt = st
				return true, nil
			}
			return false, nil
		})
		if err != nil {
			return rep, err
		}
		if interrupt == nil {
			if st, _, err := o.store.Step(ctx, jobID, sp.ID); err == nil && st.State == jobstore.StepCancelled {
				rep.Cancelled = append(rep.Cancelled, sp.ID)
			}
			continue
		}
		c := protocol.Control{Op: protocol.ControlCancel, JobID: jobID, StepID: sp.ID, Epoch: interrupt.Epoch}
		if err := o.agentRequest(ctx, interrupt.Pool, interrupt.Actor, c); err != nil {
			rep.Unreached = append(rep.Unreached, sp.ID)
		} else {
			rep.Interrupted = append(rep.Interrupted, sp.ID)
		}
	}
	dlq.Kick(ctx, o.nc, jobID)
	return rep, nil
}

// RetryJob reopens a finished job's failed, dead-lettered and cancelled
// steps with a fresh attempt budget (and the steps skipped because of them).
func (o *Ops) RetryJob(ctx context.Context, jobID string) ([]string, error) {
	job, _, err := o.store.Job(ctx, jobID)
	if err != nil {
		return nil, err
	}
	if !job.State.Terminal() {
		return nil, fmt.Errorf("%w: job %s is %s: only a finished job can be retried", dlq.ErrWrongState, jobID, job.State)
	}
	var reopened []string
	steps, err := o.store.Steps(ctx, job)
	if err != nil {
		return nil, err
	}
	for _, s := range steps {
		switch s.State {
		case jobstore.StepFailed, jobstore.StepDeadLettered, jobstore.StepCancelled:
		default:
			continue
		}
		if err := dlq.Reopen(ctx, o.store, jobID, s.ID, o.now().UTC()); err != nil {
			return reopened, err
		}
		reopened = append(reopened, s.ID)
	}
	if len(reopened) == 0 {
		return nil, fmt.Errorf("%w: job %s has no failed, dead-lettered or cancelled step to retry", dlq.ErrWrongState, jobID)
	}
	dlq.Kick(ctx, o.nc, jobID)
	return reopened, nil
}

// DrainAgent tells an agent to take no new tasks; running ones finish.
func (o *Ops) DrainAgent(ctx context.Context, pool, agent string) error {
	return o.agentRequest(ctx, pool, agent, protocol.Control{Op: protocol.ControlDrain})
}

// UndrainAgent tells a drained agent to take tasks again.
func (o *Ops) UndrainAgent(ctx context.Context, pool, agent string) error {
	return o.agentRequest(ctx, pool, agent, protocol.Control{Op: protocol.ControlUndrain})
}

// LimitAgent sets how many tasks an agent runs at once (at most its
// max_concurrent); 0 restores max_concurrent.
func (o *Ops) LimitAgent(ctx context.Context, pool, agent string, n int) error {
	return o.agentRequest(ctx, pool, agent, protocol.Control{Op: protocol.ControlLimit, Value: n})
}

// FailoverAgent asks the supervisor leader to move an agent's queued tasks
// to other agents now. Drain the agent first if it is alive.
func (o *Ops) FailoverAgent(ctx context.Context, pool, agent string) (string, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := o.nc.RequestWithContext(rctx, protocol.SubjectControlFailover, []byte(protocol.PresenceKey(pool, agent)))
	if err != nil {
		return "", fmt.Errorf("no supervisor leader answered: %w", err)
	}
	if r := string(m.Data); strings.HasPrefix(r, "error: ") {
		return "", errors.New(strings.TrimPrefix(r, "error: "))
	}
	return string(m.Data), nil
}

func (o *Ops) agentRequest(ctx context.Context, pool, agent string, c protocol.Control) error {
	b, _ := json.Marshal(c)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := o.nc.RequestWithContext(rctx, protocol.AgentControlSubject(pool, agent), b)
	if err != nil {
		return fmt.Errorf("agent %s.%s did not answer: %w", pool, agent, err)
	}
	if r := string(m.Data); strings.HasPrefix(r, "error: ") {
		return fmt.Errorf("agent %s.%s: %s", pool, agent, strings.TrimPrefix(r, "error: "))
	}
	return nil
}

func (o *Ops) updateJob(ctx context.Context, id string, f func(*jobstore.Job) error) error {
	for range 8 {
		j, rev, err := o.store.Job(ctx, id)
		if err != nil {
			return err
		}
		if err := f(j); err != nil {
			return err
		}
		j.UpdatedAt = o.now().UTC()
		if _, err := o.store.UpdateJob(ctx, j, rev); !errors.Is(err, jobstore.ErrConflict) {
			return err
		}
	}
	return jobstore.ErrConflict
}

func (o *Ops) updateStep(ctx context.Context, job, step string, f func(*jobstore.Step) (bool, error)) error {
	for range 8 {
		st, rev, err := o.store.Step(ctx, job, step)
		if err != nil {
			return err
		}
		changed, err := f(st)
		if err != nil || !changed {
			return err
		}
		st.UpdatedAt = o.now().UTC()
		if _, err := o.store.UpdateStep(ctx, st, rev); !errors.Is(err, jobstore.ErrConflict) {
			return err
		}
	}
	return jobstore.ErrConflict
}

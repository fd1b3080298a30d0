package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Ops acts on one deployment.
type Ops struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	store *jobstore.Store
	now   func() time.Time
	// replyTimeout bounds SubmitJob's wait for a scheduler's confirmation.
	replyTimeout time.Duration
}

// New returns operators' actions over nc and store.
func New(nc *nats.Conn, store *jobstore.Store) *Ops {
	js, err := jetstream.New(nc)
	if err != nil {
		// jetstream.New fails only on invalid options; there are none.
		panic(err)
	}
	return &Ops{nc: nc, js: js, store: store, now: time.Now, replyTimeout: client.DefaultReplyTimeout}
}

// CancelReport says what a cancel did.
type CancelReport = client.CancelReport

// CancelJob is client.Cancel (one implementation for the CLI, the HTTP API
// and programs). Its desired state becomes cancelled, durably, on
// the job record; then the job's scheduler re-reads it and, in one turn,
// cancels the steps not started, marks the running ones cancelled-desired
// and tells their agents to stop. That turn is the cancel's effective time:
// CancelJob returns after it, and no step is dispatched after it (a
// scheduler holding an older copy of the job fails its next write, because
// every unfinished step record changed, and re-reads). A running step ends
// cancelled with its result, or when its lease ends if its agent never
// answers. If no scheduler answers, CancelJob writes the steps' desired
// state itself, so the cancel holds whichever scheduler comes next.
// WaitJob waits for the job to end.
func (o *Ops) CancelJob(ctx context.Context, jobID string) (CancelReport, error) {
	return client.New(o.js, client.Options{}).Cancel(ctx, jobID)
}

// CancelJobCompensate cancels like CancelJob and then has the steps that
// succeeded undone (issue 13's compensation).
func (o *Ops) CancelJobCompensate(ctx context.Context, jobID string) (CancelReport, error) {
	return client.New(o.js, client.Options{}).CancelCompensate(ctx, jobID)
}

// WaitJob waits until the job is terminal (or ctx ends) and returns it;
// WaitJobPatiently with no patience: failed reads are tried again until
// ctx ends.
func (o *Ops) WaitJob(ctx context.Context, jobID string, every time.Duration) (*jobstore.Job, error) {
	return o.WaitJobPatiently(ctx, jobID, every, 0)
}

// waitReadTimeout bounds one read of a wait whose context has no deadline.
const waitReadTimeout = 5 * time.Second

// WaitJobPatiently waits until the job is terminal and returns it, reading
// it every `every`. A read that fails is tried again: the job store may be
// out of reach for a moment (a reconnect, a stream leader moving) while the
// job goes on, and a wait that gave up at the first failed read made
// `warden job cancel` fail as if the cancel had not happened. It gives up
// once reads have failed for patience in a row (0: never), when ctx ends,
// at once when the job does not exist or the connection is closed; its
// error is then a *WaitError.
func (o *Ops) WaitJobPatiently(ctx context.Context, jobID string, every, patience time.Duration) (*jobstore.Job, error) {
	var (
		last        *jobstore.Job
		failingFrom time.Time // zero while reads succeed
	)
	for {
		rctx, cancel := context.WithTimeout(ctx, waitReadTimeout)
		j, _, err := o.store.Job(rctx, jobID)
		cancel()
		switch {
		case err == nil:
			if j.State.Terminal() {
				return j, nil
			}
			last, failingFrom = j, time.Time{}
		case ctx.Err() != nil:
			return last, &WaitError{Job: jobID, Last: last, Err: ctx.Err()}
		case errors.Is(err, jobstore.ErrNotFound), errors.Is(err, nats.ErrConnectionClosed):
			return last, &WaitError{Job: jobID, Last: last, Err: err}
		case failingFrom.IsZero():
			failingFrom = time.Now()
		case patience > 0 && time.Since(failingFrom) >= patience:
			return last, &WaitError{Job: jobID, Last: last, Err: fmt.Errorf("reads failed for %s: %w", time.Since(failingFrom).Round(time.Millisecond), err)}
		}
		select {
		case <-ctx.Done():
			return last, &WaitError{Job: jobID, Last: last, Err: ctx.Err()}
		case <-time.After(every):
		}
	}
}

// WaitError is a wait that ended before its job did; the job goes on as
// it would have. Its code is its cause's.
type WaitError struct {
	Job string
	// Last is the job as last read, nil if no read succeeded.
	Last *jobstore.Job
	Err  error
}

func (e *WaitError) Error() string {
	return fmt.Sprintf("waiting for job %s to end: %v", e.Job, e.Err)
}

func (e *WaitError) Unwrap() error { return e.Err }

// RetryJob reopens a job's failed, dead-lettered, cancelled and expired
// steps with a fresh attempt budget (and the steps skipped because of them),
// and asks a scheduler to run them. It is the explicit way to run a
// cancelled job again (a dead-letter retry refuses to); a job being
// cancelled, or not finished with none of its steps failed, is refused. All the steps are reopened in
// one pass (dlq.RetryJob: each record read once and written at most
// once, pipelined). A retry that fails part-way returns a
// *PartialRetryError naming the steps it did reopen, and has asked for
// those to run.
func (o *Ops) RetryJob(ctx context.Context, jobID string) ([]string, error) {
	if !protocol.ValidToken(jobID) {
		return nil, Errorf(CodeNotFound, "job %q: not found", jobID)
	}
	reopened, err := dlq.RetryJob(ctx, o.store, jobID, o.now().UTC())
	if err != nil {
		if len(reopened) > 0 {
			// What was reopened runs now, not after the supervisor's
			// grace; the caller's deadline may be what stopped the
			// retry, so the kick has a context of its own (Kick bounds it).
			dlq.Kick(context.WithoutCancel(ctx), o.nc, jobID)
			return nil, &PartialRetryError{Job: jobID, Reopened: reopened, Err: err}
		}
		return nil, err
	}
	dlq.Kick(ctx, o.nc, jobID)
	return reopened, nil
}

// PartialRetryError is a job retry that reopened some steps (asking a
// scheduler to run them) and then failed; its code is its cause's.
type PartialRetryError struct {
	Job      string
	Reopened []string
	Err      error
}

func (e *PartialRetryError) Error() string {
	return fmt.Sprintf("job %s: reopened %s (a scheduler was asked to run them), then the retry failed: %v",
		e.Job, strings.Join(e.Reopened, ", "), e.Err)
}

func (e *PartialRetryError) Unwrap() error { return e.Err }

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
	if !protocol.ValidToken(pool) || !protocol.ValidToken(agent) {
		return "", Errorf(CodeInvalid, "agent %q of pool %q: not a valid id", agent, pool)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := o.nc.RequestWithContext(rctx, protocol.SubjectControlFailover, []byte(protocol.PresenceKey(pool, agent)))
	if err != nil {
		return "", &Error{Code: CodeUnavailable, Msg: "no supervisor leader answered", Err: err}
	}
	return protocol.ParseReply(m.Data)
}

func (o *Ops) agentRequest(ctx context.Context, pool, agent string, c protocol.Control) error {
	if !protocol.ValidToken(pool) || !protocol.ValidToken(agent) {
		// As Agent answers: no agent has such an id. Unchecked, the id went
		// into the subject and nats.go's "bad subject" became 503.
		return Errorf(CodeNotFound, "agent %q of pool %q: not found", agent, pool)
	}
	b, _ := json.Marshal(c)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := o.nc.RequestWithContext(rctx, protocol.AgentControlSubject(pool, agent), b)
	if errors.Is(err, nats.ErrNoResponders) {
		// Nobody listens: an agent that is not there is "not found" (exit
		// 3, as the HTTP route answers 404), not NATS being down (exit 4).
		if _, aerr := o.Agent(ctx, pool, agent); CodeOf(aerr) == CodeNotFound {
			return aerr
		}
	}
	if err != nil {
		return &Error{Code: CodeUnavailable, Msg: fmt.Sprintf("agent %s.%s did not answer", pool, agent), Err: err}
	}
	if _, err := protocol.ParseReply(m.Data); err != nil {
		return fmt.Errorf("agent %s.%s: %w", pool, agent, err)
	}
	return nil
}

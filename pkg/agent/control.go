package agent

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/pkg/protocol"
)

// ErrCancelled is the handler context's cause when an operator cancelled
// the step (warden job cancel).
var ErrCancelled = errors.New("step cancelled by an operator")

// serveControl obeys orders on the agent's control subject and answers
// them on the requester's inbox. An order without a reply subject (the
// scheduler's cancel orders) is obeyed unanswered. An order whose reply
// subject is not an inbox (protocol.ValidReplySubject) is dropped, neither
// obeyed nor answered: the answer would go out with the agent's permissions
// (it may write its presence key, results and dead letters), a write the
// requester chose and could not make itself; and a message the server
// delivers from a consumer carries a $JS.ACK. reply, so an order forged
// through a consumer's deliver subject is not obeyed either.
func (a *Agent) serveControl() (*nats.Subscription, error) {
	subject := protocol.AgentControlSubject(a.cfg.Pool, a.cfg.ID)
	sub, err := a.nc.Subscribe(subject, func(m *nats.Msg) {
		if m.Reply != "" && !protocol.ValidReplySubject(m.Reply) {
			a.log.Warn().Str("reply", m.Reply).Msg("control order with a reply subject that is not an inbox: dropped")
			return
		}
		reply := protocol.OKReply("")
		if err := a.control(m.Data); err != nil {
			reply = protocol.ErrorReply(protocol.CodeFailed, err)
		}
		if m.Reply != "" {
			_ = m.Respond(reply)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", subject, err)
	}
	return sub, nil
}

func (a *Agent) control(body []byte) error {
	var c protocol.Control
	if err := json.Unmarshal(body, &c); err != nil {
		return protocol.NewReplyError(protocol.CodeInvalidRequest, "undecodable control message: %v", err)
	}
	switch c.Op {
	case protocol.ControlCancel:
		if !protocol.ValidToken(c.JobID) || !protocol.ValidToken(c.StepID) || c.Epoch == 0 {
			// Kept, such an order would take one of the kept cancels'
			// places (1,024) and match no task.
			return protocol.NewReplyError(protocol.CodeInvalidRequest, "a cancel order names a job, a step and an epoch (got %q, %q, %d)", c.JobID, c.StepID, c.Epoch)
		}
		key := protocol.TaskMsgID(c.JobID, c.StepID, c.Epoch)
		v, ok := a.running.Load(key)
		if !ok {
			// Kept: its task may still be queued here (cancels.go). Looked
			// for again once kept: a run that registered between the two
			// looked for a kept cancel before there was one.
			a.cancels.add(key, c.Token, a.now())
			if v, ok = a.running.Load(key); !ok {
				return protocol.NewReplyError(protocol.CodeNotFound, "step %s.%s at epoch %d is not running here", c.JobID, c.StepID, c.Epoch)
			}
			a.cancels.take(key, c.Token, a.now())
		}
		a.log.Warn().Str("job_id", c.JobID).Str("step_id", c.StepID).Msg("cancelling a running step on request")
		v.(*runningTask).cancel(ErrCancelled)
	case protocol.ControlDrain:
		a.held.Store(true)
		a.stopPull()
		a.log.Warn().Msg("drained by an operator: taking no new tasks")
	case protocol.ControlLimit:
		n := c.Value
		if n <= 0 || n > a.cfg.MaxConcurrent {
			n = a.cfg.MaxConcurrent
		}
		a.limit.Store(int32(n))
		a.stopPull()
		a.log.Warn().Int("limit", n).Int("max_concurrent", a.cfg.MaxConcurrent).Msg("concurrency limit set on request")
	case protocol.ControlUndrain:
		a.held.Store(false)
		a.log.Info().Msg("undrained by an operator: taking tasks again")
	default:
		return protocol.NewReplyError(protocol.CodeInvalidRequest, "unknown control op %q", c.Op)
	}
	return nil
}

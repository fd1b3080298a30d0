package handagent

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Agent is a scripted SDK agent.
type Agent struct {
	*agenttest.Agent
}

// Options tune the agent's consumer.
type Options struct {
	AckWait    time.Duration // default 10s; at least the runtime's minimum lease (300ms)
	MaxDeliver int           // default 5
}

// Drop is a result status that makes the agent Nak the task and report
// nothing, as an agent crashing mid-task would (but faster).
const Drop = "drop"

// minLease is the runtime's smallest lease (agent.Config.Lease).
const minLease = 300 * time.Millisecond

// Start runs an agent offering "echo", with at most 64 tasks at once,
// until the test ends.
func Start(t testing.TB, js jetstream.JetStream, pool, id string, caps []string, opts ...Options) *Agent {
	t.Helper()
	cfg := agent.Config{ID: id, Pool: pool, Capabilities: caps, MaxConcurrent: 64}
	for _, o := range opts {
		if o.AckWait > 0 {
			cfg.Lease = protocol.Duration(max(o.AckWait, minLease))
		}
		if o.MaxDeliver != 0 {
			cfg.MaxDeliver = o.MaxDeliver
		}
	}
	return &Agent{agenttest.StartAgent(t, js.Conn(), cfg)}
}

// Reply sets how tasks are answered; nil answers success echoing the
// params. A reply that blocks holds the task (its lease is kept alive).
// Status Drop hands the task back unreported; a failed status fails the
// step with Error, classified by ErrorClass (none: the scheduler decides).
func (a *Agent) Reply(f func(protocol.Task) protocol.Result) {
	if f == nil {
		a.Script(nil)
		return
	}
	a.Script(func(_ context.Context, t *agent.Task) (any, error) {
		r := f(t.Task)
		switch r.Status {
		case Drop:
			return nil, agenttest.ErrDrop
		case protocol.ResultFailed:
			err := errors.New(r.Error)
			switch r.ErrorClass {
			case protocol.ClassPermanent:
				err = agent.Permanent(err)
			case protocol.ClassRetriable:
				err = agent.RetryAfter(r.RetryAfter.Std(), err)
			}
			return outputOf(r), err
		}
		return outputOf(r), nil
	})
}

func outputOf(r protocol.Result) any {
	if len(r.Output) == 0 {
		return nil
	}
	return json.RawMessage(r.Output)
}

// PublishResult publishes r as an agent would.
func PublishResult(ctx context.Context, js jetstream.JetStream, r protocol.Result) error {
	return agenttest.PublishResult(ctx, js, r)
}

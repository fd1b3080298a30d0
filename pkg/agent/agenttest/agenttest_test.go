package agenttest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/protocol"
)

func TestRun(t *testing.T) {
	t.Parallel()
	double := func(_ context.Context, task *agent.Task) (any, error) {
		var p struct {
			N int `json:"n"`
		}
		if err := task.Bind(&p); err != nil {
			return nil, err
		}
		return map[string]int{"n": 2 * p.N}, nil
	}
	res := agenttest.Run(t, double, agenttest.NewTask(t, "double", map[string]int{"n": 21}))
	var out struct{ N int }
	agenttest.DecodeOutput(t, res, &out)
	if res.Status != protocol.ResultSucceeded || out.N != 42 {
		t.Fatalf("got %+v", res)
	}

	res = agenttest.Run(t, double, agenttest.NewTask(t, "double", map[string]any{"m": 1}))
	if res.Status != protocol.ResultFailed || res.ErrorClass != protocol.ClassPermanent {
		t.Fatalf("unknown field: got %+v", res)
	}

	slow := func(ctx context.Context, _ *agent.Task) (any, error) {
		<-ctx.Done()
		return nil, agent.RetryAfter(time.Minute, context.Cause(ctx))
	}
	res = agenttest.Run(t, slow, agenttest.WithTimeout(agenttest.NewTask(t, "slow", nil), 20*time.Millisecond))
	if res.ErrorClass != protocol.ClassRetriable || res.RetryAfter.Std() != time.Minute {
		t.Fatalf("timeout: got %+v", res)
	}

	boom := func(context.Context, *agent.Task) (any, error) { panic(errors.New("boom")) }
	res = agenttest.Run(t, boom, agenttest.NewTask(t, "boom", nil))
	if res.Status != protocol.ResultFailed || res.Error != "handler panicked: boom" {
		t.Fatalf("panic: got %+v", res)
	}
}

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

// Run ends a handler's context when an agent does, a margin before the
// step's deadline (2s, a tenth of the time left at most), so that the
// failure can be reported in time, and does not start one that has no
// time left. The kit ran it until the deadline itself, and ran it when the
// deadline had passed.
func TestRunDeadlineAsAnAgent(t *testing.T) {
	t.Parallel()
	task := agenttest.NewTask(t, "deadline", nil)
	task.Deadline = time.Now().Add(time.Hour)
	var got time.Time
	res := agenttest.Run(t, func(ctx context.Context, _ *agent.Task) (any, error) {
		got, _ = ctx.Deadline()
		return nil, nil
	}, task)
	if want := task.Deadline.Add(-2 * time.Second); res.Status != protocol.ResultSucceeded || !got.Equal(want) {
		t.Fatalf("handler's context ends %s (result %+v), want %s, 2s before the step's deadline", got, res, want)
	}

	late := agenttest.NewTask(t, "late", nil)
	late.Deadline = time.Now().Add(-time.Second)
	ran := false
	res = agenttest.Run(t, func(context.Context, *agent.Task) (any, error) {
		ran = true
		return nil, nil
	}, late)
	if want := "step deadline reached: passed before the handler could start"; ran || res.Status != protocol.ResultFailed || res.Error != want {
		t.Fatalf("ran=%v, result %+v; want the handler not run and the error %q", ran, res, want)
	}
}

package agenttest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
)

// NewTask returns a first delivery of action with params encoded as JSON
// (a json.RawMessage or []byte is used as is), for job "job-test", step
// "step-test", epoch 1, logging to the test.
func NewTask(tb testing.TB, action string, params any) *agent.Task {
	tb.Helper()
	var raw json.RawMessage
	switch p := params.(type) {
	case nil:
	case json.RawMessage:
		raw = p
	case []byte:
		raw = p
	default:
		b, err := json.Marshal(p)
		if err != nil {
			tb.Fatalf("agenttest: encode params: %v", err)
		}
		raw = b
	}
	return &agent.Task{
		Task: protocol.Task{
			JobID: "job-test", StepID: "step-test", Epoch: 1, Attempt: 1,
			Action: action, Params: raw,
		},
		Delivery: 1,
		Log:      zerolog.New(zerolog.NewTestWriter(tb)),
	}
}

// Run runs h for task and returns the result the agent would report. The
// handler's context ends at task.Deadline, or task.Timeout after start, or
// when the test ends.
func Run(tb testing.TB, h agent.HandlerFunc, task *agent.Task) protocol.Result {
	tb.Helper()
	ctx := tb.Context()
	if !task.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadlineCause(ctx, task.Deadline, agent.ErrDeadline)
		defer cancel()
	}
	if task.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, task.Timeout.Std(), agent.ErrDeadline)
		defer cancel()
	}
	return agent.Execute(ctx, h, task)
}

// DecodeOutput decodes a result's output into v, failing the test if it
// cannot.
func DecodeOutput(tb testing.TB, r protocol.Result, v any) {
	tb.Helper()
	if err := json.Unmarshal(r.Output, v); err != nil {
		tb.Fatalf("agenttest: decode output %s: %v", r.Output, err)
	}
}

// WithTimeout returns task with a step timeout, for handlers that must
// honour their context.
func WithTimeout(task *agent.Task, d time.Duration) *agent.Task {
	task.Timeout = protocol.Duration(d)
	return task
}

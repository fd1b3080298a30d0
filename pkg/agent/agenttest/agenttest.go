package agenttest

import (
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

// Run runs h for task and returns the result an agent with the default
// configuration would report (agent.Execute; agent.ExecuteConfig for
// another): the handler's context ends as the agent ends it, a margin
// before task.Deadline or task.Timeout after start (cause agent.ErrDeadline),
// or when the test ends; a task whose deadline leaves no time is not run;
// the result is cut to max_result_bytes.
func Run(tb testing.TB, h agent.HandlerFunc, task *agent.Task) protocol.Result {
	tb.Helper()
	return agent.Execute(tb.Context(), h, task)
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

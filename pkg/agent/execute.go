package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Execute runs h for t the way the agent does, without NATS or leases:
// a panic becomes a failure, the error's type sets the class, the output is
// encoded as JSON. It is what agenttest uses; the runtime adds deadlines,
// lease extension and reporting around the same steps.
func Execute(ctx context.Context, h HandlerFunc, t *Task) protocol.Result {
	started := time.Now()
	out, err := call(ctx, h, t)
	return buildResult(t, "", "", started, time.Now(), out, err)
}

// call runs h, turning a panic into a *panicError: a panic in h, and one
// in the handler's own code that reading its return values runs (its
// output's MarshalJSON; its error's Error, ErrorClass or RetryAfter, as
// with a typed nil error). Read unguarded later, in buildResult, such a
// panic took the whole agent down with every task it had in flight, and
// again at each delivery. The output comes back encoded (json.RawMessage).
func call(ctx context.Context, h HandlerFunc, t *Task) (out any, err error) {
	defer func() {
		if v := recover(); v != nil {
			out, err = nil, &panicError{value: v, stack: debug.Stack()}
		}
	}()
	out, err = h(ctx, t)
	if out != nil {
		b, merr := json.Marshal(out)
		switch {
		case merr == nil:
			out = json.RawMessage(b)
		case err == nil:
			out, err = nil, Permanent(fmt.Errorf("encode output as JSON: %w", merr))
		default:
			out = nil
		}
	}
	if err != nil {
		_ = err.Error()
		classify(err)
	}
	return out, err
}

// buildResult turns a handler's return values into a protocol.Result.
// Output is kept on failure too: a failed command's stderr is worth seeing.
func buildResult(t *Task, pool, agentID string, started, finished time.Time, out any, err error) protocol.Result {
	r := protocol.Result{
		JobID:      t.JobID,
		StepID:     t.StepID,
		Epoch:      t.Epoch,
		Token:      t.Token,
		Agent:      agentID,
		Pool:       pool,
		Status:     protocol.ResultSucceeded,
		StartedAt:  started.UTC(),
		FinishedAt: finished.UTC(),
	}
	if raw, ok := out.(json.RawMessage); ok && json.Valid(raw) {
		out = nil // encoded by call already
		if string(raw) != "null" {
			r.Output = raw
		}
	}
	if out != nil {
		b, merr := json.Marshal(out)
		if merr != nil && err == nil {
			err = Permanent(fmt.Errorf("encode output as JSON: %w", merr))
		}
		if merr == nil && string(b) != "null" {
			r.Output = b
		}
	}
	if err != nil {
		class, after := classify(err)
		r.Status = protocol.ResultFailed
		r.Error = err.Error()
		r.ErrorClass = class
		r.RetryAfter = protocol.Duration(after)
	}
	return r
}

// isPanic reports whether err is a recovered panic, and its stack.
func isPanic(err error) ([]byte, bool) {
	var p *panicError
	if errors.As(err, &p) {
		return p.stack, true
	}
	return nil, false
}

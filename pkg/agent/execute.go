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
// again at each delivery. The output comes back encoded; one JSON cannot
// carry fails the task (permanent), unless the handler failed already.
func call(ctx context.Context, h HandlerFunc, t *Task) (out json.RawMessage, err error) {
	defer func() {
		if v := recover(); v != nil {
			out, err = nil, &panicError{value: v, stack: debug.Stack()}
		}
	}()
	v, err := h(ctx, t)
	if v != nil {
		b, merr := json.Marshal(v)
		switch {
		case merr == nil:
			out = b
		case err == nil:
			err = Permanent(fmt.Errorf("encode output as JSON: %w", merr))
		}
	}
	if err != nil {
		// Read here, under recover, what buildResult reads of it.
		_ = err.Error()
		classify(err)
	}
	return out, err
}

// buildResult turns a handler's encoded output (call) and error into a
// protocol.Result. Output is kept on failure too: a failed command's stderr
// is worth seeing.
func buildResult(t *Task, pool, agentID string, started, finished time.Time, out json.RawMessage, err error) protocol.Result {
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
	if string(out) != "null" {
		r.Output = out
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

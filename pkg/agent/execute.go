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

// Execute runs h for t the way an agent with the default configuration
// does, through the same code, without NATS, leases or the cluster checks:
// the handler's context ends a margin before t.Deadline (and at most
// t.Timeout after start) with cause ErrDeadline, and an error it returns
// after that says so; a handler that ignores cancellation is given up on
// after the same grace; a panic becomes a failure; the error's type sets
// the class; the output is encoded as JSON; the result is cut to
// max_result_bytes. A task whose deadline leaves no time to run is not
// run: its result is the failure of a handler that could not start
// ("step deadline reached: passed before the handler could start"), where
// an agent dead-letters it and reports nothing. It is what agenttest uses.
func Execute(ctx context.Context, h HandlerFunc, t *Task) protocol.Result {
	return ExecuteConfig(ctx, Config{}, h, t)
}

// ExecuteConfig is Execute as an agent configured with cfg (defaults
// filled in) runs it: its MaxResultBytes bounds the result.
func ExecuteConfig(ctx context.Context, cfg Config, h HandlerFunc, t *Task) protocol.Result {
	cfg = cfg.WithDefaults()
	started := time.Now()
	var o outcome
	if p, ok := planTask(started, t.Deadline, t.Timeout.Std()); ok {
		o = runHandler(ctx, handlerEnv{now: time.Now}, p, h, t)
	} else {
		o.err = notStarted(ErrDeadline)
	}
	r := buildResult(t, "", "", started, time.Now(), o.out, o.err)
	_, _, _ = fitResult(&r, cfg.MaxResultBytes) // cannot fail: call encoded the output
	return r
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

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/actions"
	"github.com/wardenhq/warden/pkg/protocol"
)

// HandlerFunc runs one step. Its output is encoded as JSON into the result;
// its error decides the outcome (see Permanent, Retriable, RetryAfter). It
// must return soon after ctx ends, and must be idempotent: a step runs at
// least once.
type HandlerFunc func(ctx context.Context, t *Task) (any, error)

// Task is a step as a handler sees it.
type Task struct {
	protocol.Task
	// Delivery counts deliveries of this task message to this agent,
	// starting at 1; more than 1 means an earlier run did not finish.
	Delivery uint64
	// Log carries job_id, step_id, epoch and action: use it so every line
	// of the step can be found.
	Log zerolog.Logger
}

// Bind decodes the task's params into v strictly: an unknown field or a
// wrong type is a permanent error naming the field.
func (t *Task) Bind(v any) error {
	if err := actions.Decode(t.Params, v); err != nil {
		return Permanent(err)
	}
	return nil
}

// errBadTask wraps every reason a message cannot be a task.
var errBadTask = errors.New("undecodable task")

// decodeTask reads a task message: the JSON body is the truth, headers fill
// fields the body left empty, and the earlier of the two deadlines wins.
func decodeTask(msg jetstream.Msg) (protocol.Task, error) {
	var t protocol.Task
	if err := json.Unmarshal(msg.Data(), &t); err != nil {
		return t, fmt.Errorf("%w: %w", errBadTask, err)
	}
	h := msg.Headers()
	if t.JobID == "" {
		t.JobID = h.Get(protocol.HeaderJob)
	}
	if t.StepID == "" {
		t.StepID = h.Get(protocol.HeaderStep)
	}
	if t.Action == "" {
		t.Action = h.Get(protocol.HeaderAction)
	}
	if t.Epoch == 0 {
		if v := h.Get(protocol.HeaderEpoch); v != "" {
			e, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return t, fmt.Errorf("%w: header %s %q: %w", errBadTask, protocol.HeaderEpoch, v, err)
			}
			t.Epoch = e
		}
	}
	if t.Token == "" {
		t.Token = h.Get(protocol.HeaderToken)
	}
	if v := h.Get(protocol.HeaderDeadline); v != "" {
		d, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return t, fmt.Errorf("%w: header %s %q: %w", errBadTask, protocol.HeaderDeadline, v, err)
		}
		if t.Deadline.IsZero() || d.Before(t.Deadline) {
			t.Deadline = d
		}
	}
	switch {
	case !protocol.ValidToken(t.JobID):
		return t, fmt.Errorf("%w: job_id %q is not a valid id", errBadTask, t.JobID)
	case !protocol.ValidToken(t.StepID):
		return t, fmt.Errorf("%w: step_id %q is not a valid id", errBadTask, t.StepID)
	case t.Action == "":
		return t, fmt.Errorf("%w: action is empty", errBadTask)
	}
	return t, nil
}

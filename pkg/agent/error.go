package agent

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Error is what a handler returns to tell the scheduler how to treat a
// failure. Build it with Permanent, Retriable or RetryAfter; find it with
// errors.As. An untyped error is reported without a class and the scheduler
// classifies it.
type Error struct {
	// Class is protocol.ClassPermanent or protocol.ClassRetriable.
	Class string
	// After asks the scheduler to wait at least this long before retrying.
	After time.Duration
	Err   error
}

func (e *Error) Error() string {
	if e.Err == nil {
		return e.Class + " error"
	}
	return e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// ErrorClass is read by the runtime through an interface, so packages that
// cannot import agent (pkg/actions) can classify their errors too.
func (e *Error) ErrorClass() string { return e.Class }

// RetryAfter is the requested minimum delay before a retry.
func (e *Error) RetryAfter() time.Duration { return e.After }

// Permanent marks err as not worth retrying: bad input, missing permission.
func Permanent(err error) error {
	return &Error{Class: protocol.ClassPermanent, Err: err}
}

// Retriable marks err as transient: the step should be tried again.
func Retriable(err error) error {
	return &Error{Class: protocol.ClassRetriable, Err: err}
}

// RetryAfter marks err as transient and asks for a retry no sooner than d.
func RetryAfter(d time.Duration, err error) error {
	return &Error{Class: protocol.ClassRetriable, After: d, Err: err}
}

// Causes the runtime gives the handler's context, read with context.Cause.
var (
	// ErrLeaseLost: the server stopped confirming the task's lease, so the
	// task may already run elsewhere. The runtime reports nothing.
	ErrLeaseLost = errors.New("task lease lost: the server did not confirm an extension in time")
	// ErrDeadline: the step's deadline or timeout is near; the runtime
	// reports a failure before the deadline.
	ErrDeadline = errors.New("step deadline reached")
	// ErrShutdown: the agent is stopping and the drain timeout passed; the
	// task is handed back (Nak) for a later run.
	ErrShutdown = errors.New("agent shutting down: drain timeout passed")
	// ErrConnectionClosed: the agent's NATS connection closed for good (its
	// reconnects spent, or closed by its owner). Nothing the handler returns
	// can be reported, nor its task handed back, and the supervisor moves
	// the step to another agent: the runtime abandons the task unreported.
	// It wraps nats.ErrConnectionClosed.
	ErrConnectionClosed = fmt.Errorf("agent's connection closed for good: %w", nats.ErrConnectionClosed)
)

// ErrStreamsMissing is returned by Run when the task stream or presence
// bucket does not exist.
var ErrStreamsMissing = errors.New("warden streams missing")

// classify reads the class and retry delay from err's chain.
func classify(err error) (class string, after time.Duration) {
	var c interface{ ErrorClass() string }
	if errors.As(err, &c) {
		class = c.ErrorClass()
	}
	var r interface{ RetryAfter() time.Duration }
	if errors.As(err, &r) {
		after = r.RetryAfter()
	}
	return class, after
}

// panicError is a recovered handler panic.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.value) }

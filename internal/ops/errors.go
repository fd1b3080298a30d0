package ops

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// Code is a stable, documented error code (docs/api.md). The CLI's exit
// code, the HTTP API's status and the NATS micro endpoints' error code are
// all derived from it, so the three surfaces agree on what went wrong.
type Code string

// Error codes. Never rename one: scripts and dashboards match on them.
const (
	// CodeInvalid: the request is malformed or names an invalid value
	// (a bad flag, spec, filter or page cursor).
	CodeInvalid Code = "invalid_argument"
	// CodeNotFound: no such job, step, agent or dead letter.
	CodeNotFound Code = "not_found"
	// CodeConflict: the target is in a state the action does not apply to
	// (cancel a finished job, retry a running one), or a concurrent write
	// won every attempt.
	CodeConflict Code = "conflict"
	// CodeRejected: the scheduler refused a submission.
	CodeRejected Code = "rejected"
	// CodeUnauthenticated: no or an unknown bearer token.
	CodeUnauthenticated Code = "unauthenticated"
	// CodeForbidden: the token's scope does not allow the action.
	CodeForbidden Code = "forbidden"
	// CodeTooLarge: the request body exceeds the limit.
	CodeTooLarge Code = "payload_too_large"
	// CodeTimeout: the operation did not finish in time (a process that
	// should answer did not).
	CodeTimeout Code = "timeout"
	// CodeUnavailable: NATS, a stream or a needed process is unreachable.
	CodeUnavailable Code = "unavailable"
	// CodeInternal: anything else.
	CodeInternal Code = "internal"
)

// Codes lists every code, for documentation and tests.
var Codes = []Code{CodeInvalid, CodeNotFound, CodeConflict, CodeRejected, CodeUnauthenticated, CodeForbidden, CodeTooLarge, CodeTimeout, CodeUnavailable, CodeInternal}

// Exit codes of the warden CLI (docs/cli.md).
const (
	ExitOK          = 0 // success
	ExitJobFailed   = 1 // submit --wait: the job ended failed or cancelled
	ExitUsage       = 2 // bad arguments, invalid spec, rejected submission, action in the wrong state
	ExitNotFound    = 3 // no such job, agent or dead letter
	ExitUnavailable = 4 // NATS, stream, connection or timeout error
)

// ExitCode is the CLI exit code for c.
func (c Code) ExitCode() int {
	switch c {
	case CodeInvalid, CodeConflict, CodeRejected, CodeTooLarge:
		return ExitUsage
	case CodeNotFound:
		return ExitNotFound
	default:
		return ExitUnavailable
	}
}

// HTTPStatus is the HTTP API's status for c.
func (c Code) HTTPStatus() int {
	switch c {
	case CodeInvalid, CodeRejected:
		return http.StatusBadRequest
	case CodeNotFound:
		return http.StatusNotFound
	case CodeConflict:
		return http.StatusConflict
	case CodeUnauthenticated:
		return http.StatusUnauthorized
	case CodeForbidden:
		return http.StatusForbidden
	case CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeTimeout:
		return http.StatusGatewayTimeout
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// Error is an error with a code. Operations return it for failures they can
// attribute; CodeOf classifies the rest.
type Error struct {
	Code Code
	// Msg says what went wrong, for people.
	Msg string
	// Err is the cause, if any.
	Err error
	// full: Msg already says what Err says (Errorf with %w).
	full bool
}

func (e *Error) Error() string {
	switch {
	case e.full:
		return e.Msg
	case e.Msg == "" && e.Err != nil:
		return e.Err.Error()
	case e.Err != nil:
		return e.Msg + ": " + e.Err.Error()
	default:
		return e.Msg
	}
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error with code c.
func Errorf(c Code, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &Error{Code: c, Msg: err.Error(), Err: errors.Unwrap(err), full: true}
}

// ErrFinished: the job is already terminal (client.ErrFinished; mapped like
// dlq.ErrWrongState).
var ErrFinished = client.ErrFinished

// CodeOf classifies err. A nil error has no code ("").
func CodeOf(err error) Code {
	var oe *Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &oe):
		return oe.Code
	case errors.Is(err, spec.ErrInvalid), errors.Is(err, jobstore.ErrBadCursor), errors.Is(err, protocol.ErrInvalidRequest):
		return CodeInvalid
	case errors.Is(err, client.ErrRejected):
		return CodeRejected
	case errors.Is(err, dlq.ErrWrongState), errors.Is(err, client.ErrFinished), errors.Is(err, jobstore.ErrConflict), errors.Is(err, jobstore.ErrExists),
		errors.Is(err, cluster.ErrChanged):
		return CodeConflict
	case errors.Is(err, client.ErrNotFound), errors.Is(err, jobstore.ErrNotFound), errors.Is(err, dlq.ErrNotFound),
		errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrMsgNotFound), errors.Is(err, protocol.ErrNotFound):
		return CodeNotFound
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		// Whatever cut the wait (a timeout, a cancel, a dropped
		// connection), the submission may be stored: a timeout, as the
		// HTTP API answers it, never internal.
		errors.Is(err, client.ErrOutcomeUnknown):
		return CodeTimeout
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrNoServers),
		errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrBucketNotFound), errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		// A process that understood the request and could not carry it
		// out now (protocol.CodeFailed: asking again later may work).
		errors.Is(err, protocol.ErrFailed):
		return CodeUnavailable
	default:
		return CodeInternal
	}
}

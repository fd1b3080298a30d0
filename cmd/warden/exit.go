package main

import (
	"errors"
	"fmt"

	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/dlq"
	"github.com/wardenhq/warden/pkg/jobstore"
	"github.com/wardenhq/warden/pkg/spec"
)

// Exit codes a script can rely on (docs/cli.md).
const (
	exitOK          = 0 // success
	exitJobFailed   = 1 // submit --wait: the job ended failed or cancelled
	exitUsage       = 2 // bad flags or arguments, unreadable or invalid spec, rejected submission, an action on a job or step in the wrong state
	exitNotFound    = 3 // no such job
	exitUnavailable = 4 // NATS connection, stream or timeout error
)

// errUsage marks errors in how the command was called.
var errUsage = errors.New("usage")

func usageError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errUsage}, args...)...)
}

// exitError carries an exit code chosen by a command, with the message to
// print (none when err is nil: the command already said everything).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// exitCode maps an error to the documented exit codes. Anything not
// recognised is treated as an infrastructure problem: the commands wrap
// every error they can attribute to the caller.
func exitCode(err error) int {
	var ee *exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, errUsage), errors.Is(err, spec.ErrInvalid), errors.Is(err, client.ErrRejected), errors.Is(err, dlq.ErrWrongState):
		return exitUsage
	case errors.Is(err, client.ErrNotFound), errors.Is(err, jobstore.ErrNotFound), errors.Is(err, dlq.ErrNotFound):
		return exitNotFound
	default:
		return exitUnavailable
	}
}

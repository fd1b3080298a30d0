package main

import (
	"errors"
	"fmt"

	"github.com/wardenhq/warden/internal/natsconn"
	"github.com/wardenhq/warden/internal/ops"
)

// Exit codes a script can rely on (docs/cli.md). They come from the ops
// facade's error codes (ops.Code.ExitCode), which the HTTP API and the NATS
// micro endpoints use too.
const (
	exitOK          = ops.ExitOK
	exitJobFailed   = ops.ExitJobFailed
	exitUsage       = ops.ExitUsage
	exitNotFound    = ops.ExitNotFound
	exitUnavailable = ops.ExitUnavailable
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

// exitCode maps an error to the documented exit codes: usage errors are the
// CLI's own, everything else is classified by the ops facade (anything it
// does not recognise is an infrastructure problem, exit 4).
func exitCode(err error) int {
	var ee *exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, new(*natsconn.PermissionError)):
		return exitPermission // permission.go: a refusal, never "unavailable"
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, errUsage):
		return exitUsage
	default:
		return ops.CodeOf(err).ExitCode()
	}
}

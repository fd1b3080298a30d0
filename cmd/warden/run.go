package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/spec"
)

// run executes the CLI with args and returns the process exit code. It is
// the whole program but for signal handling, so tests run it in-process.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err != nil && !a.started {
		// Cobra failed before any command ran: unknown command, bad
		// arguments or flags.
		err = &exitError{code: exitUsage, err: err}
	}
	err = a.perm.explain(err)
	code := exitCode(err)
	a.report(err, code)
	return code
}

// report prints a failed command's error on stderr: text, or with --json a
// JSON object scripts can parse.
func (a *app) report(err error, code int) {
	var ee *exitError
	if err == nil || (errors.As(err, &ee) && ee.err == nil) {
		return
	}
	if a.json {
		c := ops.CodeOf(err)
		if errors.Is(err, errUsage) {
			c = ops.CodeInvalid
		}
		if c.ExitCode() != code {
			// A command chose the exit code (an exitError): the code says
			// the same, or a script branching on it reads "internal" for a
			// schedule that does not exist (exit 3).
			c = codeForExit(code, c)
		}
		_ = writeJSON(a.stderr, struct {
			Error    string   `json:"error"`
			Code     ops.Code `json:"code,omitempty"`
			Reason   string   `json:"reason,omitempty"`
			ExitCode int      `json:"exit_code"`
		}{err.Error(), c, spec.ReasonOf(err), code})
		return
	}
	fmt.Fprintf(a.stderr, "warden: %v\n", err)
	if code == exitUsage && errors.Is(err, errUsage) {
		fmt.Fprintln(a.stderr, "Run 'warden --help' for usage.")
	}
}

// codeForExit is the error code a command's chosen exit code stands for
// (c when none does).
func codeForExit(code int, c ops.Code) ops.Code {
	switch code {
	case exitUsage:
		return ops.CodeInvalid
	case exitNotFound:
		return ops.CodeNotFound
	case exitPermission:
		return ops.CodeForbidden
	case exitUnavailable:
		if c == ops.CodeTimeout || c == ops.CodeInternal {
			return c
		}
		return ops.CodeUnavailable
	}
	return c
}

package actions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// DefaultTailBytes is how much of stdout and stderr shell keeps by default.
const DefaultTailBytes = 4096

// ShellConfig says what shell may run.
type ShellConfig struct {
	// AllowedCommands are the only commands shell runs, matched exactly
	// against the command parameter ("/usr/bin/make" and "make" are
	// different entries). A name is looked up in the agent's PATH; an entry
	// with a slash must be absolute. Defaults to none: shell refuses
	// everything.
	AllowedCommands []string `yaml:"allowed_commands"`
	// AllowedArgs pins the arguments of a command listed in
	// allowed_commands (keyed by the same string): a task's args must
	// match one of its entries, a list of regular expressions (RE2) each
	// matched against the whole of one argument, as many arguments as
	// patterns; [[]] allows no arguments only. E.g. {git: [[fetch,
	// origin], [checkout, "[0-9a-f]{40}"]]}. A command without an entry
	// takes any arguments, and most programs run any code through theirs
	// (git -c alias.x='!cmd' x, find -exec, make --eval): list one for
	// every command whose tasks are not trusted. Defaults to none.
	AllowedArgs map[string][][]string `yaml:"allowed_args"`
	// AllowedEnv, when set, are the only variables a task's env may set.
	// Defaults to none, which allows any variable except tool options and
	// config locations such as MAKEFLAGS, GIT_*, HOME and XDG_*. PATH, LD_*, DYLD_*, BASH_FUNC_* and the other
	// loader and shell start-up variables are refused either way.
	AllowedEnv []string `yaml:"allowed_env"`
	// TailBytes is how many trailing bytes of stdout and stderr go into the
	// result. Defaults to 4096.
	TailBytes int `yaml:"tail_bytes"`
	// ExitCodes maps a command's non-zero exit code to the class of its
	// failure, "retriable" or "permanent", e.g. {75: retriable, 1:
	// permanent}. A task's own exit_codes parameter overrides it code by
	// code. An unmapped code is reported without a class, for the
	// scheduler to classify by message. Defaults to none.
	ExitCodes map[int]string `yaml:"exit_codes"`
}

// Exit code classes.
const (
	ExitRetriable = "retriable"
	ExitPermanent = "permanent"
)

// Validate reports the first allowed_commands entry that is a relative
// path, the first allowed_args entry for a command not in
// allowed_commands, without an argument list or with an invalid pattern,
// the first allowed_env entry no task may set, or the first exit_codes
// entry that is not 1..255 mapped to retriable or permanent.
func (c ShellConfig) Validate() error {
	for i, cmd := range c.AllowedCommands {
		if err := checkCommandPath(cmd); err != nil {
			return fmt.Errorf("shell.allowed_commands[%d]: %w", i, err)
		}
	}
	if _, err := compileArgs(c.AllowedArgs, c.AllowedCommands); err != nil {
		return err
	}
	for i, name := range c.AllowedEnv {
		if problem := neverAllowedEnv(name); problem != "" {
			return fmt.Errorf("shell.allowed_env[%d]: %q %s", i, name, problem)
		}
	}
	if err := checkExitCodes(c.ExitCodes); err != nil {
		return fmt.Errorf("shell.exit_codes: %w", err)
	}
	return nil
}

// checkExitCodes checks every entry, lowest code first.
func checkExitCodes(m map[int]string) error {
	codes := make([]int, 0, len(m))
	for code := range m {
		codes = append(codes, code)
	}
	sort.Ints(codes)
	for _, code := range codes {
		if err := checkExitCode(code, m[code]); err != nil {
			return err
		}
	}
	return nil
}

func checkExitCode(code int, class string) error {
	if code < 1 || code > 255 {
		return fmt.Errorf("exit code %d: must be between 1 and 255", code)
	}
	if c := normaliseExitClass(class); c != ExitRetriable && c != ExitPermanent {
		return fmt.Errorf("exit code %d: class must be %q or %q, got %q", code, ExitRetriable, ExitPermanent, class)
	}
	return nil
}

func normaliseExitClass(class string) string { return strings.ToLower(strings.TrimSpace(class)) }

// ExitError is a command that ran and exited with a non-zero code.
type ExitError struct {
	Code int
	// Class is what exit_codes maps Code to; "" when unmapped.
	Class string
}

// Error does not name the command (the step's params do): an unmapped
// exit is classified by the scheduler from this text, and a command
// named timeout, or a path holding "expired", retried every exit.
func (e *ExitError) Error() string {
	return fmt.Sprintf("shell: the command exited with code %d", e.Code)
}

// ErrorClass is read by pkg/agent: "retriable", "permanent" or "" (let the
// scheduler classify the message).
func (e *ExitError) ErrorClass() string { return e.Class }

// ShellParams are the parameters of shell.
type ShellParams struct {
	// Command to run, found in the agent's PATH unless it is an absolute
	// path. Required.
	Command string `json:"command"`
	// Args are passed as they are: there is no shell to expand them. They
	// must match one of shell.allowed_args' entries for Command, if it has
	// any.
	Args []string `json:"args,omitempty"`
	// Env is added to an environment holding only the agent's PATH; see
	// ShellConfig.AllowedEnv for the variables a task may set.
	Env map[string]string `json:"env,omitempty"`
	// Dir is the working directory. Defaults to the agent's. It does not
	// change which program Command names.
	Dir string `json:"dir,omitempty"`
	// Timeout kills the command after this long. Defaults to the task's deadline.
	Timeout protocol.Duration `json:"timeout,omitempty"`
	// ExitCodes maps exit codes to failure classes for this task, over
	// shell.exit_codes, e.g. {"75": "retriable"}.
	ExitCodes map[int]string `json:"exit_codes,omitempty"`
}

// ShellOutput is shell's output; it is reported on failure too.
type ShellOutput struct {
	ExitCode   int    `json:"exit_code"`
	StdoutTail string `json:"stdout_tail"`
	StderrTail string `json:"stderr_tail"`
	Truncated  bool   `json:"truncated,omitempty"`
}

// ErrCommandNotAllowed is wrapped when the command is not in allowed_commands.
var ErrCommandNotAllowed = errors.New("command not allowed")

// Shell returns the shell action for cfg.
func Shell(cfg ShellConfig) Func {
	if cfg.TailBytes <= 0 {
		cfg.TailBytes = DefaultTailBytes
	}
	cfg.ExitCodes = maps.Clone(cfg.ExitCodes)
	// Invalid (Validate was not called), it refuses every command.
	allowedArgs, argsErr := compileArgs(cfg.AllowedArgs, cfg.AllowedCommands)
	return func(ctx context.Context, params json.RawMessage) (any, error) {
		var p ShellParams
		if err := Decode(params, &p); err != nil {
			return nil, err
		}
		if err := required("command", p.Command); err != nil {
			return nil, err
		}
		if !slices.Contains(cfg.AllowedCommands, p.Command) {
			return nil, Permanentf("%w: %q is not in shell.allowed_commands %q", ErrCommandNotAllowed, p.Command, cfg.AllowedCommands)
		}
		if err := checkCommandPath(p.Command); err != nil {
			return nil, Permanentf("%w: %w", ErrCommandNotAllowed, err)
		}
		if err := checkArgs(p.Command, p.Args, allowedArgs, argsErr); err != nil {
			return nil, err
		}
		_, pinned := cfg.AllowedArgs[p.Command]
		if err := checkEnv(p.Env, cfg.AllowedEnv, pinned); err != nil {
			return nil, err
		}
		if err := checkExitCodes(p.ExitCodes); err != nil {
			return nil, Permanentf("%w: field \"exit_codes\": %w", ErrInvalidParams, err)
		}
		if p.Timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeoutCause(ctx, p.Timeout.Std(),
				fmt.Errorf("shell: command timed out after %s", p.Timeout))
			defer cancel()
		}
		return runCommand(ctx, cfg, p)
	}
}

// exitClass is the class of code: the task's mapping, then the config's; an
// invalid config entry (see Validate) counts as unmapped.
func exitClass(cfg ShellConfig, p ShellParams, code int) string {
	for _, m := range []map[int]string{p.ExitCodes, cfg.ExitCodes} {
		if class, ok := m[code]; ok {
			if c := normaliseExitClass(class); c == ExitRetriable || c == ExitPermanent {
				return c
			}
		}
	}
	return ""
}

// checkCommandPath refuses a relative path with a slash ("./build.sh"): it
// would be found in the task's dir, so the task would choose the program.
func checkCommandPath(command string) error {
	if strings.Contains(command, "/") && !filepath.IsAbs(command) {
		return fmt.Errorf("%q has a slash but is not an absolute path, so it would be found in the task's dir", command)
	}
	return nil
}

func runCommand(ctx context.Context, cfg ShellConfig, p ShellParams) (any, error) {
	tailBytes := cfg.TailBytes
	// exec looks a bare name up with this agent's own PATH, before Dir
	// applies; one found only through a relative PATH entry (exec.ErrDot)
	// is refused below, as "./build.sh" is (checkCommandPath).
	cmd := exec.CommandContext(ctx, p.Command, p.Args...)
	cmd.Dir = p.Dir
	cmd.Env = commandEnv(p.Env)
	stdout, stderr := newTail(tailBytes), newTail(tailBytes)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// The command's own process group: ending the context kills what the
	// command started too (proc_*.go).
	cmd.SysProcAttr = commandSysProcAttr()
	cmd.Cancel = func() error { return killGroup(cmd.Process) }
	// A child that inherited the pipes must not keep us waiting after the
	// command was killed.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if cmd.Process != nil {
		// What the command left running in its group ends with it: a
		// child left by a failed attempt ran beside the retry, and one
		// left by a success outlived its step. (A child that left the
		// group, setsid, is beyond reach.)
		_ = killGroup(cmd.Process)
	}
	if errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState != nil && cmd.ProcessState.Success() {
		// It exited 0; a child it left kept its output open past
		// WaitDelay. The step succeeded (the child is killed above).
		err = nil
	}
	out := ShellOutput{
		ExitCode:   cmd.ProcessState.ExitCode(), // -1 when it did not start or was killed
		StdoutTail: stdout.String(),
		StderrTail: stderr.String(),
		Truncated:  stdout.Truncated() || stderr.Truncated(),
	}
	switch {
	case err == nil:
		return out, nil
	case ctx.Err() != nil:
		return out, fmt.Errorf("shell: %s killed: %w", p.Command, context.Cause(ctx))
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, exec.ErrDot), errors.Is(err, os.ErrNotExist), errors.Is(err, os.ErrPermission):
		return out, Permanentf("shell: cannot start %s: %w", p.Command, err)
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return out, &ExitError{Code: out.ExitCode, Class: exitClass(cfg, p, out.ExitCode)}
	}
	return out, fmt.Errorf("shell: %s: %w", p.Command, err)
}

// commandEnv is the agent's PATH plus the task's variables (checked by
// checkEnv, so none of them is PATH), sorted for determinism.
func commandEnv(extra map[string]string) []string {
	env := []string{"PATH=" + os.Getenv("PATH")}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+extra[k])
	}
	return env
}

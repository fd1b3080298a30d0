package actions_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wardenhq/warden/internal/actions"
	"github.com/wardenhq/warden/internal/config"
)

func TestShellExitCodes(t *testing.T) {
	t.Parallel()
	cfg := actions.ShellConfig{
		AllowedCommands: []string{"sh"},
		ExitCodes:       map[int]string{75: "retriable", 1: "permanent", 3: " Permanent "},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	shell := actions.Shell(cfg)
	cfg.ExitCodes[2] = "retriable" // the action keeps its own copy
	cases := []struct {
		name      string
		params    string
		code      int
		class     string
		wantErr   string
		permanent bool // a parameter error rather than an exit
	}{
		{name: "success", params: `{"command":"sh","args":["-c","exit 0"]}`},
		{name: "mapped retriable", params: `{"command":"sh","args":["-c","exit 75"]}`, code: 75, class: "retriable"},
		{name: "mapped permanent", params: `{"command":"sh","args":["-c","exit 1"]}`, code: 1, class: "permanent"},
		{name: "mapping is normalised", params: `{"command":"sh","args":["-c","exit 3"]}`, code: 3, class: "permanent"},
		{name: "unmapped", params: `{"command":"sh","args":["-c","exit 2"]}`, code: 2, class: ""},
		{name: "task mapping overrides", params: `{"command":"sh","args":["-c","exit 1"],"exit_codes":{"1":"retriable"}}`, code: 1, class: "retriable"},
		{name: "task mapping adds", params: `{"command":"sh","args":["-c","exit 4"],"exit_codes":{"4":"permanent"}}`, code: 4, class: "permanent"},
		{name: "task mapping bad class", params: `{"command":"sh","args":["-c","exit 4"],"exit_codes":{"4":"maybe"}}`,
			wantErr: `field "exit_codes": exit code 4: class must be`, class: "permanent", permanent: true},
		{name: "task mapping bad code", params: `{"command":"sh","exit_codes":{"0":"retriable"}}`,
			wantErr: "exit code 0: must be between 1 and 255", class: "permanent", permanent: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			out, err := shell(context.Background(), json.RawMessage(c.params))
			if c.permanent {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) || !errors.Is(err, actions.ErrInvalidParams) || classOf(err) != "permanent" {
					t.Fatalf("error %v, want a permanent invalid-params error containing %q", err, c.wantErr)
				}
				return
			}
			if c.code == 0 {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			var exit *actions.ExitError
			if !errors.As(err, &exit) || exit.Code != c.code {
				t.Fatalf("error %v, want an *ExitError with code %d", err, c.code)
			}
			if got := classOf(err); got != c.class {
				t.Fatalf("class %q, want %q", got, c.class)
			}
			if want := "exited with code"; !strings.Contains(err.Error(), want) {
				t.Fatalf("message %q, want it to contain %q", err, want)
			}
			if o, ok := out.(actions.ShellOutput); !ok || o.ExitCode != c.code {
				t.Fatalf("output %#v, want exit_code %d", out, c.code)
			}
		})
	}
}

func TestShellConfigExitCodes(t *testing.T) {
	t.Parallel()
	var cfg actions.ShellConfig
	if err := config.Decode([]byte("allowed_commands: [make]\nexit_codes: {75: retriable, 1: permanent}\n"), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.ExitCodes[75] != "retriable" || cfg.ExitCodes[1] != "permanent" {
		t.Fatalf("decoded %+v", cfg)
	}
	for _, bad := range []struct {
		codes map[int]string
		want  string
	}{
		{map[int]string{0: "retriable"}, "shell.exit_codes: exit code 0: must be between 1 and 255"},
		{map[int]string{256: "retriable"}, "exit code 256"},
		{map[int]string{2: "retriable", 1: "soon"}, `exit code 1: class must be "retriable" or "permanent", got "soon"`},
	} {
		err := actions.ShellConfig{ExitCodes: bad.codes}.Validate()
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Validate(%v) = %v, want %q", bad.codes, err, bad.want)
		}
	}
}

// shellOK runs params and fails the test unless the command succeeded with
// wantStdout.
func shellOK(t *testing.T, shell actions.Func, params, wantStdout string) {
	t.Helper()
	out, err := shell(context.Background(), json.RawMessage(params))
	if err != nil {
		t.Fatalf("unexpected error %v", err)
	}
	if o, ok := out.(actions.ShellOutput); !ok || !strings.Contains(o.StdoutTail, wantStdout) {
		t.Fatalf("output %#v, want stdout containing %q", out, wantStdout)
	}
}

// shellRefused runs params and fails the test unless it was refused, before
// running anything, with a permanent error wrapping target and containing want.
func shellRefused(t *testing.T, shell actions.Func, params string, target error, want string) {
	t.Helper()
	out, err := shell(context.Background(), json.RawMessage(params))
	if !errors.Is(err, target) || classOf(err) != "permanent" || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v (output %#v), want a permanent %q error containing %q", err, out, target, want)
	}
	if out != nil {
		t.Fatalf("output %#v, want none: the command must not run", out)
	}
}

// The allow-list names a program; a task's env must not change which code
// that program runs.
func TestShellEnv(t *testing.T) {
	t.Parallel()
	const open, listed = "without allowed_env", "with allowed_env"
	shells := map[string]actions.Func{
		open: actions.Shell(actions.ShellConfig{AllowedCommands: []string{"env"}}),
		// PATH listed by mistake (Validate refuses it) must still be refused.
		listed: actions.Shell(actions.ShellConfig{AllowedCommands: []string{"env"}, AllowedEnv: []string{"BUILD_ID", "MAKEFLAGS", "PATH"}}),
	}
	env := func(name string) string {
		b, _ := json.Marshal(map[string]any{"command": "env", "env": map[string]string{name: "x"}})
		return string(b)
	}
	t.Run("plain variable", func(t *testing.T) {
		t.Parallel()
		shellOK(t, shells[open], env("BUILD_ID"), "BUILD_ID=x\n")
		shellOK(t, shells[open], env("BUILD_ID"), "PATH="+os.Getenv("PATH")+"\n")
	})
	t.Run("listed variable", func(t *testing.T) {
		t.Parallel()
		shellOK(t, shells[listed], env("MAKEFLAGS"), "MAKEFLAGS=x\n")
	})
	for _, c := range []struct {
		config string
		name   string
		want   string
	}{
		{open, "PATH", `"PATH" may never be set by a task`},
		{listed, "PATH", `"PATH" may never be set by a task`},
		{open, "LD_PRELOAD", "dynamic loader"},
		{listed, "LD_LIBRARY_PATH", "dynamic loader"},
		{open, "LD_AUDIT", "dynamic loader"},
		{open, "DYLD_INSERT_LIBRARIES", "dynamic loader"},
		{open, "BASH_FUNC_echo%%", "shell function"},
		{open, "BASH_ENV", `"BASH_ENV" may never be set`},
		{open, "SHELLOPTS", `"SHELLOPTS" may never be set`},
		{open, "PS4", `"PS4" may never be set`},
		{open, "GCONV_PATH", `"GCONV_PATH" may never be set`},
		// Would reach the child as PATH=/tmp/evil:=x.
		{open, "PATH=/tmp/evil:", "not a valid variable name"},
		{open, "x%%", "not a valid variable name"},
		{open, "", "not a valid variable name"},
		{open, "MAKEFLAGS", "list it in shell.allowed_env"},
		{open, "GIT_CONFIG_COUNT", "list it in shell.allowed_env"},
		{open, "GIT_SSH_COMMAND", "list it in shell.allowed_env"},
		{open, "NODE_OPTIONS", "list it in shell.allowed_env"},
		// Where git finds ~/.gitconfig, whose aliases run any command.
		{open, "HOME", "list it in shell.allowed_env"},
		{open, "XDG_CONFIG_HOME", "list it in shell.allowed_env"},
		{open, "ENV", "list it in shell.allowed_env"},
		{listed, "OTHER", `"OTHER" is not in shell.allowed_env`},
		{listed, "GIT_CONFIG_COUNT", "is not in shell.allowed_env"},
	} {
		t.Run(c.config+" refuses "+c.name, func(t *testing.T) {
			t.Parallel()
			shellRefused(t, shells[c.config], env(c.name), actions.ErrEnvNotAllowed, c.want)
		})
	}
}

// The task's dir is where the command runs, never where it is found.
func TestShellCommandResolution(t *testing.T) {
	t.Parallel()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"build.sh", "echo"} {
		script := "#!/bin/sh\necho from the task dir\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	abs := filepath.Join(dir, "build.sh")
	shell := actions.Shell(actions.ShellConfig{AllowedCommands: []string{"./build.sh", "echo", "sh", abs}})
	params := func(command, dir string, args ...string) string {
		b, _ := json.Marshal(actions.ShellParams{Command: command, Args: args, Dir: dir})
		return string(b)
	}
	t.Run("refuses a relative path", func(t *testing.T) {
		t.Parallel()
		shellRefused(t, shell, params("./build.sh", dir), actions.ErrCommandNotAllowed, "not an absolute path")
	})
	t.Run("name found in the agent's PATH", func(t *testing.T) {
		t.Parallel()
		shellOK(t, shell, params("echo", dir, "real echo"), "real echo\n")
	})
	t.Run("absolute path", func(t *testing.T) {
		t.Parallel()
		shellOK(t, shell, params(abs, ""), "from the task dir\n")
	})
	t.Run("runs in the task dir", func(t *testing.T) {
		t.Parallel()
		shellOK(t, shell, params("sh", dir, "-c", "pwd"), dir+"\n")
	})
	t.Run("program keeps its name", func(t *testing.T) {
		t.Parallel()
		shellOK(t, shell, params("sh", "", "-c", "echo $0"), "sh\n")
	})
}

func TestShellConfigValidate(t *testing.T) {
	t.Parallel()
	ok := actions.ShellConfig{AllowedCommands: []string{"make", "/usr/bin/git"}, AllowedEnv: []string{"MAKEFLAGS", "GIT_AUTHOR_NAME"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate(%+v) = %v, want nil", ok, err)
	}
	for _, bad := range []struct {
		cfg  actions.ShellConfig
		want string
	}{
		{actions.ShellConfig{AllowedCommands: []string{"make", "./build.sh"}}, `shell.allowed_commands[1]: "./build.sh" has a slash but is not an absolute path`},
		{actions.ShellConfig{AllowedCommands: []string{"bin/tool"}}, `shell.allowed_commands[0]: "bin/tool"`},
		{actions.ShellConfig{AllowedEnv: []string{"BUILD_ID", "PATH"}}, `shell.allowed_env[1]: "PATH" may never be set by a task`},
		{actions.ShellConfig{AllowedEnv: []string{"LD_PRELOAD"}}, `shell.allowed_env[0]: "LD_PRELOAD" may never be set`},
		{actions.ShellConfig{AllowedEnv: []string{"A=B"}}, `"A=B" is not a valid variable name`},
	} {
		if err := bad.cfg.Validate(); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Validate(%+v) = %v, want %q", bad.cfg, err, bad.want)
		}
	}
}

// allowed_args pins what a command may be asked to do: find, allowed by
// name, would otherwise run any program through -exec.
func TestShellAllowedArgs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var cfg actions.ShellConfig
	yaml := "allowed_commands: [find, echo, pwd]\n" +
		"allowed_args: {find: [[., -name, '[a-z]+\\.txt']], pwd: [[]]}\n"
	if err := config.Decode([]byte(yaml), &cfg); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	shell := actions.Shell(cfg)
	params := func(command string, args ...string) string {
		b, _ := json.Marshal(actions.ShellParams{Command: command, Args: args, Dir: dir})
		return string(b)
	}
	shellOK(t, shell, params("find", ".", "-name", "a.txt"), "./a.txt\n")
	shellOK(t, shell, params("pwd"), "/")
	shellOK(t, shell, params("echo", "-n", "any", "args"), "any args") // no entry: any args
	for _, args := range [][]string{
		{".", "-exec", "touch", "pwned", ";"},
		{".", "-name", "a.txt", "-exec", "touch", "pwned", ";"},
		{".", "-name", "a.txt; touch pwned"}, // a pattern matches the whole argument
		{".", "-name"},
	} {
		shellRefused(t, shell, params("find", args...), actions.ErrArgsNotAllowed, "match none of the 1 entries of shell.allowed_args[find]")
	}
	shellRefused(t, shell, params("pwd", "-P"), actions.ErrArgsNotAllowed, "shell.allowed_args[pwd]")
	if _, err := os.Stat(filepath.Join(dir, "pwned")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused command ran: %v", err)
	}

	for _, bad := range []struct {
		cfg  actions.ShellConfig
		want string
	}{
		{actions.ShellConfig{AllowedCommands: []string{"find"}, AllowedArgs: map[string][][]string{"git": {{"status"}}}},
			`shell.allowed_args[git]: "git" is not in shell.allowed_commands`},
		{actions.ShellConfig{AllowedCommands: []string{"find"}, AllowedArgs: map[string][][]string{"find": {}}},
			"shell.allowed_args[find]: must list at least one argument list"},
		{actions.ShellConfig{AllowedCommands: []string{"find"}, AllowedArgs: map[string][][]string{"find": {{"."}, {".", "(["}}}},
			"shell.allowed_args[find][1][1]: error parsing regexp"},
	} {
		err := bad.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Validate(%+v) = %v, want %q", bad.cfg, err, bad.want)
		}
		// Run without Validate, an invalid allowed_args refuses everything.
		shellRefused(t, actions.Shell(bad.cfg), params("find", "."), actions.ErrArgsNotAllowed, bad.want)
	}
}

// A task's env could undo shell.allowed_args: with tar's arguments pinned
// and no allowed_env, TAR_OPTIONS="--checkpoint=1
// --checkpoint-action=exec=…" ran any command (a reviewer showed it). A
// pinned command now takes only the variables allowed_env lists; the
// variables through which common tools take options are refused anyway.
//
// Old code: "env {FOO:1} for pinned tar: <nil>, want refused" and
// "TAR_OPTIONS for unpinned tar: <nil>, want refused".
func TestShellEnvCannotUndoPinnedArgs(t *testing.T) {
	t.Parallel()
	pinned := actions.ShellConfig{
		AllowedCommands: []string{"true"},
		AllowedArgs:     map[string][][]string{"true": {{"-cf", "out\\.tar"}}},
	}
	run := func(cfg actions.ShellConfig, env map[string]string) error {
		t.Helper()
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		params, _ := json.Marshal(actions.ShellParams{Command: "true", Args: []string{"-cf", "out.tar"}, Env: env})
		_, err := actions.Shell(cfg)(context.Background(), params)
		return err
	}
	if err := run(pinned, map[string]string{"FOO": "1"}); !errors.Is(err, actions.ErrEnvNotAllowed) {
		t.Errorf("env {FOO:1} for pinned true: %v, want refused", err)
	}
	listed := pinned
	listed.AllowedEnv = []string{"FOO"}
	if err := run(listed, map[string]string{"FOO": "1"}); err != nil {
		t.Errorf("env {FOO:1} listed in allowed_env: %v, want run", err)
	}
	unpinned := actions.ShellConfig{AllowedCommands: []string{"true"}}
	for _, name := range []string{"TAR_OPTIONS", "RSYNC_RSH", "CC", "GOTOOLCHAIN"} {
		if err := run(unpinned, map[string]string{name: "x"}); !errors.Is(err, actions.ErrEnvNotAllowed) {
			t.Errorf("%s for unpinned true: %v, want refused", name, err)
		}
	}
	if err := run(unpinned, map[string]string{"FOO": "1"}); err != nil {
		t.Errorf("env {FOO:1} for unpinned true: %v, want run", err)
	}
}

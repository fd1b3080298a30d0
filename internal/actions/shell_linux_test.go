package actions_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/actions"
	"github.com/wardenhq/warden/internal/retry"
)

// waitPIDFile waits for the pid a script wrote to dir/pid and kills that
// process when the test ends, whatever became of it.
func waitPIDFile(t *testing.T, dir string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(dir, "pid"))
		if err == nil {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("pid file %q: %v", b, err)
			}
			t.Cleanup(func() {
				if processAlive(pid) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatal("the command did not write its pid file within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// processAlive reports whether pid is a sleep that has not ended (a zombie
// has: an init that does not reap, as in some containers, keeps it listed).
func processAlive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// "<pid> (<comm>) <state> ...": comm may hold spaces, so split at ')'.
	comm, rest, ok := strings.Cut(string(stat), ") ")
	return ok && strings.HasSuffix(comm, "(sleep") && !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

// waitGone waits for pid to end, failing the test with why if it does not.
func waitGone(t *testing.T, pid int, why string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still running 10s after %s", pid, why)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A cancelled command takes what it started with it: killing the command
// alone left a script's or make's children running, re-parented to init,
// beside the step's retry and after the agent.
func TestShellCancelKillsProcessGroup(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	shell := actions.Shell(actions.ShellConfig{AllowedCommands: []string{"sh"}})
	params, _ := json.Marshal(actions.ShellParams{Command: "sh", Dir: dir,
		Args: []string{"-c", "sleep 300 & echo $! > pid.tmp && mv pid.tmp pid; wait"}})
	ctx, cancel := context.WithCancelCause(context.Background())
	type result struct {
		out any
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := shell(ctx, params)
		done <- result{out, err}
	}()
	child := waitPIDFile(t, dir)
	stop := errors.New("step cancelled")
	cancel(stop)
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("shell did not return within 10s of its context ending")
	}
	if !errors.Is(r.err, stop) {
		t.Fatalf("error %v, want one wrapping the context's cause", r.err)
	}
	waitGone(t, child, "its command was cancelled")
}

// The command dies with the agent, here a test binary killed while it runs
// one (the parent-death signal).
func TestShellCommandDiesWithAgent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	agent := exec.Command(os.Args[0], "-test.run=^TestShellHelperAgent$")
	agent.Env = append(os.Environ(), "WARDEN_SHELL_HELPER_DIR="+dir)
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agent.Process.Kill(); _ = agent.Wait() })
	child := waitPIDFile(t, dir)
	if err := agent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = agent.Wait()
	waitGone(t, child, "the agent running it was killed")
}

// TestShellHelperAgent is the agent TestShellCommandDiesWithAgent kills: it
// runs a command that writes its pid and sleeps.
func TestShellHelperAgent(t *testing.T) {
	dir := os.Getenv("WARDEN_SHELL_HELPER_DIR")
	if dir == "" {
		t.Skip("run by TestShellCommandDiesWithAgent")
	}
	shell := actions.Shell(actions.ShellConfig{AllowedCommands: []string{"sh"}})
	params, _ := json.Marshal(actions.ShellParams{Command: "sh", Dir: dir,
		Args: []string{"-c", "echo $$ > pid.tmp && mv pid.tmp pid && exec sleep 300"}})
	_, _ = shell(context.Background(), params)
}

// What a command leaves running in its process group ends with it. A
// child left by a failed attempt ran beside the retry; one left holding
// the output of a command that exited 0 failed the step for good
// (exec.ErrWaitDelay, unclassified) and outlived it.
//
// Old code: "background child … still runs" after exit 3; "command exited
// 0 but the step failed: shell: sh: exec: WaitDelay expired before I/O
// complete".
func TestShellEndsWhatTheCommandLeftInItsGroup(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, script string
		fails        bool
	}{
		{"failed", "sleep 30 >/dev/null 2>&1 & echo $! > %s; exit 3", true},
		{"succeeded holding its output", "sleep 30 & echo $! > %s; exit 0", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cfg := actions.ShellConfig{AllowedCommands: []string{"sh"}}
			params, _ := json.Marshal(actions.ShellParams{Command: "sh",
				Args: []string{"-c", strings.ReplaceAll(c.script, "%s", filepath.Join(dir, "pid"))}})
			_, err := actions.Shell(cfg)(context.Background(), params)
			pid := waitPIDFile(t, dir)
			if (err != nil) != c.fails {
				t.Errorf("step error %v, want failed=%v", err, c.fails)
			}
			waitGone(t, pid, "its step ended")
		})
	}
}

// An unmapped exit is classified by the scheduler from the error's text,
// which named the command: coreutils timeout (or a path holding
// "expired") made every exit retriable. The text no longer names it.
// (Found by a reviewer.)
//
// Old code: "shell: timeout exited with code 1: classified timeout,
// retriable".
func TestShellExitTextDoesNotClassifyByTheCommand(t *testing.T) {
	t.Parallel()
	cfg := actions.ShellConfig{AllowedCommands: []string{"timeout"}}
	params, _ := json.Marshal(actions.ShellParams{Command: "timeout", Args: []string{"5", "false"}})
	_, err := actions.Shell(cfg)(context.Background(), params)
	var ee *actions.ExitError
	if !errors.As(err, &ee) || ee.Code != 1 {
		t.Fatalf("timeout 5 false: %v, want exit 1", err)
	}
	if d := retry.Classify(ee.ErrorClass(), err.Error(), 0, retry.DefaultClassification()); d.Retriable {
		t.Fatalf("%s: classified %s, retriable", err, d.Class)
	}
}

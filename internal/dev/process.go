package dev

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/wardenhq/warden/internal/natsconn"
)

// child is one running binary.
type child struct {
	Process
	cmd  *exec.Cmd
	out  *prefixWriter
	done chan struct{} // closed when the child has exited
	err  error         // its exit status, valid after done
}

// start launches p. Cancelling ctx sends SIGTERM; a child still running
// shutdownTimeout later is killed.
func start(ctx context.Context, bin string, p Process, env []string, out *output, width int, shutdownTimeout time.Duration) (*child, error) {
	cmd := exec.CommandContext(ctx, bin, p.Args...)
	cmd.Env = env
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = shutdownTimeout
	cmd.SysProcAttr = sysProcAttr()
	c := &child{Process: p, cmd: cmd, done: make(chan struct{})}
	c.out = newPrefixWriter(out, fmt.Sprintf("%-*s | ", width, p.Name))
	// The same writer for both: exec then copies them through one pipe and
	// one goroutine, which prefixWriter relies on.
	cmd.Stdout, cmd.Stderr = c.out, c.out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", p.Name, bin, err)
	}
	go func() {
		c.err = cmd.Wait()
		c.out.flush()
		close(c.done)
	}()
	return c, nil
}

// describe renders how the child ended: from its exit status when there is
// one (Wait reports a cancelled context even for a clean exit on SIGTERM).
func (c *child) describe() string {
	switch ps := c.cmd.ProcessState; {
	case ps != nil && ps.Success():
		return "exited cleanly"
	case ps != nil:
		return "exited: " + ps.String()
	case c.err != nil:
		return "exited: " + c.err.Error()
	default:
		return "exited"
	}
}

// childEnv is the environment of every child: ours, pointed at the
// embedded server. The NATS variables natsconn reads are dropped: the
// embedded server has no authentication (a user's credentials would be
// refused) and no TLS.
func childEnv(url string, consoleLogs bool) []string {
	var env []string
	for _, kv := range os.Environ() {
		// The NATS settings a user exported describe another server: a CA
		// makes the children demand TLS of the plaintext embedded one, an
		// inbox prefix is a production identity's.
		if name, _, _ := strings.Cut(kv, "="); slices.Contains(natsconn.EnvVars, name) {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "NATS_URL="+url)
	if consoleLogs && os.Getenv("WARDEN_LOG_FORMAT") == "" {
		env = append(env, "WARDEN_LOG_FORMAT=console")
	}
	return env
}

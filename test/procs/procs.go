package procs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Build compiles the named commands into dir and returns their paths by
// name. A bare name is cmd/<name>; a path (./test/testagent) is built as is
// and named by its last element.
func Build(dir string, names ...string) (map[string]string, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	args := []string{"build", "-o", dir + string(os.PathSeparator)}
	for _, n := range names {
		pkg := "./cmd/" + n
		if strings.Contains(n, "/") {
			pkg, n = n, filepath.Base(n)
			if len(n) > 1 && n[0] == 'v' && strings.Trim(n[1:], "0123456789") == "" {
				n = filepath.Base(filepath.Dir(pkg)) // module/v2 -> module
			}
		}
		args = append(args, pkg)
		out[n] = filepath.Join(dir, n)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %v\n%s", err, b)
	}
	return out, nil
}

func moduleRoot() (string, error) {
	b, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(b))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the module")
	}
	return filepath.Dir(mod), nil
}

// Proc is a running process whose output is kept for assertions.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	err  error
}

type lockedWriter struct{ p *Proc }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	return w.p.out.Write(b)
}

// Start runs bin with args; the process is killed when the test ends if it
// is still running, and its output is logged on failure.
func Start(t testing.TB, name, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: name, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), "WARDEN_LOG_FORMAT=json")
	p.cmd.Stdout = lockedWriter{p}
	p.cmd.Stderr = lockedWriter{p}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if p.Running() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- output of %s ---\n%s", name, p.Output())
		}
	})
	return p
}

// PID is the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Output returns everything the process wrote so far.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// Running reports whether the process has not exited.
func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Wait waits for the process to exit and returns its exit code.
func (p *Proc) Wait(ctx context.Context) (int, error) {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), nil
	case <-ctx.Done():
		return -1, fmt.Errorf("%s still running: %w", p.Name, ctx.Err())
	}
}

// WaitOutput waits until the output contains s.
func (p *Proc) WaitOutput(t testing.TB, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.Output(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not print %q within %s", p.Name, s, timeout)
		}
		if !p.Running() && !strings.Contains(p.Output(), s) {
			t.Fatalf("%s exited without printing %q", p.Name, s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Main is a TestMain for a package of process tests: it builds the named
// binaries (as Build) into a temporary directory, stores their paths in
// *bins, runs the tests, removes the directory and exits with the tests'
// code.
//
//	var bins map[string]string
//	func TestMain(m *testing.M) { procs.Main(m, &bins, "scheduler", "agent") }
func Main(m *testing.M, bins *map[string]string, names ...string) {
	dir, err := os.MkdirTemp("", "warden-test-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*bins, err = Build(dir, names...)
	if err != nil {
		_ = os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

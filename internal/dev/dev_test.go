package dev_test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/dev"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/client"
)

// buildBinaries builds the real scheduler, supervisor and agent once per
// test binary run; warden dev is only as good as what it starts.
var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "warden-dev-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binDir = dir
		cmd := exec.Command("go", "build", "-o", dir+"/", "../../cmd/scheduler", "../../cmd/supervisor", "../../cmd/agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("build binaries: %v", buildErr)
	}
	return binDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// followJob connects to a dev server at url, runs inspect (if set) on its
// JetStream, submits spec, and follows the job to its end.
func followJob(ctx context.Context, url string, spec []byte, inspect func(jetstream.JetStream) error) (*jobstore.Job, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if inspect != nil {
		if err := inspect(js); err != nil {
			return nil, err
		}
	}
	c := client.New(js, client.Options{})
	r, err := c.Submit(ctx, spec, client.SubmitOptions{})
	if err != nil {
		return nil, err
	}
	if !r.Confirmed {
		return nil, errors.New("the scheduler did not confirm the job")
	}
	return c.Follow(ctx, r.JobID, nil)
}

func TestDevRunsTheDemoJobOnRealProcesses(t *testing.T) {
	t.Parallel()
	bin := binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec, err := os.ReadFile("../../examples/deploy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out natstest.Buffer
	var final *jobstore.Job
	err = dev.Run(ctx, dev.Config{
		DataDir: t.TempDir(), Port: -1, BinDir: bin, ConfigDir: "../../configs", Out: &out,
		ExitAfterReady: true,
		OnReady: func(ctx context.Context, env dev.Env) (err error) {
			final, err = followJob(ctx, env.URL, spec, nil)
			return err
		},
	})
	if err != nil {
		t.Fatalf("dev.Run: %v\n%s", err, out.String())
	}
	if final == nil || final.State != jobstore.JobSucceeded {
		t.Fatalf("demo job %+v\n%s", final, out.String())
	}
	log := out.String()
	for _, want := range []string{"all 3 agents are present", "scheduler  | ", "agent-3    | ", "agent-1 exited cleanly", "NATS server stopped"} {
		if !strings.Contains(log, want) {
			t.Fatalf("output lacks %q:\n%s", want, log)
		}
	}
}

func TestDevFailsWhenAChildDiesDuringStartup(t *testing.T) {
	t.Parallel()
	real := binaries(t)
	bin := t.TempDir()
	for _, b := range []string{"scheduler", "supervisor"} {
		if err := os.Symlink(filepath.Join(real, b), filepath.Join(bin, b)); err != nil {
			t.Fatal(err)
		}
	}
	// An agent that cannot start, as a broken build or a bad flag would.
	if err := os.WriteFile(filepath.Join(bin, "agent"), []byte("#!/bin/sh\necho 'agent: cannot start' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out natstest.Buffer
	err := dev.Run(ctx, dev.Config{DataDir: t.TempDir(), Port: -1, BinDir: bin, ConfigDir: t.TempDir(), Out: &out, Agents: 1})
	if !errors.Is(err, dev.ErrChildExited) || !strings.Contains(err.Error(), "agent-1") {
		t.Fatalf("got %v, want ErrChildExited naming agent-1\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "agent-1    | agent: cannot start") || !strings.Contains(out.String(), "scheduler exited") {
		t.Fatalf("output:\n%s", out.String())
	}
}

func TestDevNamesMissingBinaries(t *testing.T) {
	t.Parallel()
	err := dev.Run(context.Background(), dev.Config{BinDir: t.TempDir(), DataDir: t.TempDir(), Port: -1})
	if !errors.Is(err, dev.ErrMissingBinary) || !strings.Contains(err.Error(), "scheduler, supervisor, agent") {
		t.Fatalf("got %v", err)
	}
}

func TestDevStopsOnCancel(t *testing.T) {
	t.Parallel()
	bin := binaries(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out natstest.Buffer
	done := make(chan error, 1)
	go func() {
		done <- dev.Run(ctx, dev.Config{DataDir: t.TempDir(), Port: -1, BinDir: bin, ConfigDir: "../../configs", Out: &out, Agents: 1})
	}()
	deadline := time.After(time.Minute)
	for !strings.Contains(out.String(), "Warden is running") {
		select {
		case err := <-done:
			t.Fatalf("Run returned early: %v\n%s", err, out.String())
		case <-deadline:
			t.Fatalf("never ready:\n%s", out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel() // what Ctrl-C does
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("Run did not stop:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "agent-1 exited cleanly") {
		t.Fatalf("output:\n%s", out.String())
	}
}

// A resized deployment (--task-shards, the scheduler file's partitions)
// runs: every child is told what the streams were made with. Before, the
// children kept their files' 4 shards and exited on the mismatch.
func TestDevRunsAResizedDeployment(t *testing.T) {
	t.Parallel()
	bin := binaries(t)
	cfgDir := t.TempDir()
	for _, f := range []string{"scheduler.yaml", "supervisor.yaml", "agent.yaml"} {
		body, err := os.ReadFile(filepath.Join("../../configs", f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "scheduler.yaml" {
			body = []byte(strings.Replace(string(body), "\npartitions: 8\n", "\npartitions: 4\n", 1))
			if !strings.Contains(string(body), "\npartitions: 4\n") {
				t.Fatal("configs/scheduler.yaml no longer says partitions: 8")
			}
		}
		if err := os.WriteFile(filepath.Join(cfgDir, f), body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out natstest.Buffer
	var final *jobstore.Job
	var streamNames []string
	err := dev.Run(ctx, dev.Config{
		DataDir: t.TempDir(), Port: -1, BinDir: bin, ConfigDir: cfgDir, Out: &out, Agents: 1, TaskShards: 2,
		ExitAfterReady: true,
		OnReady: func(ctx context.Context, env dev.Env) (err error) {
			spec := []byte(`{"name":"resized","steps":[{"id":"a","action":"echo","params":{"message":"hi"}}]}`)
			final, err = followJob(ctx, env.URL, spec, func(js jetstream.JetStream) error {
				for l := js.StreamNames(ctx); ; {
					name, ok := <-l.Name()
					if !ok {
						return nil
					}
					streamNames = append(streamNames, name)
				}
			})
			return err
		},
	})
	if err != nil {
		t.Fatalf("dev.Run: %v\n%s", err, out.String())
	}
	if final == nil || final.State != jobstore.JobSucceeded {
		t.Fatalf("job %+v\n%s", final, out.String())
	}
	names := strings.Join(streamNames, " ")
	if !strings.Contains(names, "WARDEN_TASKS_1") || strings.Contains(names, "WARDEN_TASKS_2") {
		t.Fatalf("streams %s, want task shards 0 and 1 only", names)
	}
}

// A taken metrics port is named, with the flag that moves it, before
// anything starts; it used to crash the scheduler at start and end the
// sandbox with "child process exited".
func TestDevNamesATakenMetricsPort(t *testing.T) {
	t.Parallel()
	bin := binaries(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	port := l.Addr().(*net.TCPAddr).Port
	var out natstest.Buffer
	err = dev.Run(context.Background(), dev.Config{DataDir: t.TempDir(), Port: -1, BinDir: bin, ConfigDir: "../../configs",
		Out: &out, Agents: 1, MetricsPort: port})
	if err == nil || errors.Is(err, dev.ErrChildExited) || !strings.Contains(err.Error(), "--metrics-port") {
		t.Fatalf("got %v, want an error naming --metrics-port\n%s", err, out.String())
	}
}

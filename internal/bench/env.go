package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/embedded"
	"github.com/wardenhq/warden/test/procs"
)

// Config is what the bench command asks for.
type Config struct {
	// Only lists the phases to run; empty runs all of them.
	Only []string
	// Quick shortens every phase (for CI and smoke runs).
	Quick bool
	// Server is "binary" (a nats-server process per phase, the default) or
	// "embedded" (in this process).
	Server string
	// NATSServer is the nats-server binary; empty builds the version in
	// go.mod into the work directory.
	NATSServer string
	// WorkDir holds binaries and server stores; empty makes a temp dir.
	WorkDir string
	// ScaleAgents are the fleet sizes of the scale phase.
	ScaleAgents []int
	// RSSSteps is how many queued steps the memory phase creates.
	RSSSteps int
	// FailoverTrials is how many agents are killed holding a step.
	FailoverTrials int
	// TakeoverTrials is how many times the supervisor leader is killed.
	TakeoverTrials int
	// DAGSteps is the size of the large jobs (fan-out, probe, cancel).
	// Defaults to 1000.
	DAGSteps int
	// ChainSteps is the length of the chain. Defaults to 100.
	ChainSteps int
	// HistoryJobs is how many finished jobs the history phase leaves
	// behind before it lists jobs and starts a supervisor. Defaults to
	// 20,000.
	HistoryJobs int
	// ProfileDir, when set, receives CPU profiles of nats-server (its
	// -profile port) and of this process over the throughput, job-shaped
	// pipeline and scale (idle and targeted) windows.
	ProfileDir string
	// Log receives progress lines.
	Log io.Writer
}

// Phases in run order.
var Phases = []string{"raw", "throughput", "latency", "dag", "delayed", "concurrency", "history", "failover", "cluster", "scale", "memory"}

// Env is shared by the phases of one run.
type Env struct {
	cfg    Config
	rep    *Report
	work   string
	bins   map[string]string // scheduler, supervisor, bench, nats-server
	self   string            // this executable, for `bench agent`
	serial int
	// halfRate is the rate the latency phase offered Warden as half load,
	// for the pipeline's run at the same rate.
	halfRate float64
}

func (e *Env) logf(format string, args ...any) {
	fmt.Fprintf(e.cfg.Log, "%s  %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// pick returns quick in --quick mode, normal otherwise.
func pick[T any](e *Env, normal, quick T) T {
	if e.cfg.Quick {
		return quick
	}
	return normal
}

// natsServer is one server for one phase.
type natsServer struct {
	URL string
	Dir string
	// ProfilePort serves the server's pprof (binary mode with a profile
	// directory); 0: none.
	ProfilePort int
	proc        *procs.Proc
	emb         *server.Server
}

// PID is the server's process id (this process when embedded).
func (s *natsServer) PID() int {
	if s.proc != nil {
		return s.proc.PID()
	}
	return os.Getpid()
}

func (s *natsServer) stop() {
	if s.emb != nil {
		s.emb.Shutdown()
		s.emb.WaitForShutdown()
	}
	if s.proc != nil && s.proc.Running() {
		_ = s.proc.Signal(15)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := s.proc.Wait(ctx); err != nil {
			s.proc.Kill()
		}
		cancel()
	}
	_ = os.RemoveAll(s.Dir)
}

// startServer starts a fresh server with the same settings every phase
// uses: JetStream, file storage in a new directory, loopback, defaults
// otherwise (streams are R1 because Warden's replicas default to 1).
func (e *Env) startServer(tb *runTB) *natsServer {
	e.serial++
	dir := filepath.Join(e.work, fmt.Sprintf("store-%d", e.serial))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatalf("store dir: %v", err)
	}
	s := &natsServer{Dir: dir}
	if e.cfg.Server == "embedded" {
		srv, err := embedded.Start(embedded.Options{Port: -1, StoreDir: dir, ServerName: "bench"})
		if err != nil {
			tb.Fatalf("embedded server: %v", err)
		}
		s.emb, s.URL = srv, srv.ClientURL()
	} else {
		port := freePort(tb)
		args := []string{"-js", "-sd", dir, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-n", "bench"}
		if e.cfg.ProfileDir != "" {
			s.ProfilePort = freePort(tb)
			args = append(args, "--profile", strconv.Itoa(s.ProfilePort))
		}
		s.proc = procs.Start(tb, "nats-server", e.bins["nats-server"], args...)
		s.URL = fmt.Sprintf("nats://127.0.0.1:%d", port)
		deadline := time.Now().Add(15 * time.Second)
		for {
			nc, err := nats.Connect(s.URL)
			if err == nil {
				nc.Close()
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("nats-server not ready: %v\n%s", err, s.proc.Output())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	tb.Cleanup(s.stop)
	return s
}

func freePort(tb *runTB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// connect returns a connection closed at the phase's end.
func connect(tb *runTB, url, name string) (*nats.Conn, jetstream.JetStream) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectBufSize(64<<20))
	if err != nil {
		tb.Fatalf("connect %s: %v", url, err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192))
	if err != nil {
		tb.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// prepare builds the binaries the phases need (cmd/<name> for each of
// bins, and nats-server).
func (e *Env) prepare(bins []string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	e.self = self
	e.bins = map[string]string{}
	if len(bins) > 0 {
		e.logf("building %s (test/procs.Build)", strings.Join(bins, ", "))
		b, err := procs.Build(filepath.Join(e.work, "bin"), bins...)
		if err != nil {
			return err
		}
		for k, v := range b {
			e.bins[k] = v
		}
	}
	if e.cfg.Server == "embedded" {
		return nil
	}
	if e.cfg.NATSServer != "" {
		e.bins["nats-server"] = e.cfg.NATSServer
	} else {
		out := filepath.Join(e.work, "bin", "nats-server")
		e.logf("building nats-server %s from go.mod", server.VERSION)
		cmd := exec.Command("go", "build", "-o", out, "github.com/nats-io/nats-server/v2")
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build nats-server: %v\n%s", err, b)
		}
		e.bins["nats-server"] = out
	}
	v, err := exec.Command(e.bins["nats-server"], "--version").Output()
	if err != nil {
		return fmt.Errorf("nats-server --version: %w", err)
	}
	e.rep.Set("nats_server_version", strings.TrimSpace(strings.TrimPrefix(string(v), "nats-server: ")))
	return nil
}

// stallWait is how long an asynchronous publish waits for room among the
// outstanding PubAcks: on a busy shared machine nats.go's default (200 ms)
// fails publishes that are merely slow.
const stallWait = 10 * time.Second

// publishAsync publishes m asynchronously, waiting (bounded) while too many
// PubAcks are outstanding.
func publishAsync(js jetstream.JetStream, m *nats.Msg) (jetstream.PubAckFuture, error) {
	for range 6 {
		f, err := js.PublishMsgAsync(m, jetstream.WithStallWait(stallWait))
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			return f, err
		}
	}
	return nil, jetstream.ErrTooManyStalledMsgs
}

package dev

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/embedded"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/streams"
)

// ErrChildExited: a child stopped while the system was starting, so it
// cannot work.
var ErrChildExited = errors.New("child process exited during start-up")

// Run starts the system, runs cfg.OnReady, and keeps everything running
// until ctx ends (or OnReady returns, with ExitAfterReady). It always stops
// what it started before returning.
func Run(ctx context.Context, cfg Config) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	bins, err := binaries(cfg.BinDir)
	if err != nil {
		return err
	}
	d := &devRun{cfg: cfg, out: &output{w: cfg.Out}, width: len("supervisor")}
	if n := len(fmt.Sprintf("agent-%d", cfg.Agents)); n > d.width {
		d.width = n
	}

	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if err := portFree(cfg.Host, cfg.Port); err != nil {
		return err
	}
	srv, err := embedded.Start(embedded.Options{Host: cfg.Host, Port: cfg.Port, StoreDir: dataDir, ServerName: "warden-dev"})
	if err != nil {
		return err
	}
	defer d.stopServer(srv)
	url := srv.ClientURL()
	d.say("NATS JetStream server listening on %s (data in %s)", url, cfg.DataDir)

	nc, err := nats.Connect(url, nats.Name("warden-dev"))
	if err != nil {
		return fmt.Errorf("connect to the embedded server: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	dep, err := deploymentOf(cfg)
	if err != nil {
		return err
	}
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = streams.Ensure(ectx, js, streams.Options{TaskShards: dep.TaskShards, Partitions: dep.Partitions})
	cancel()
	if err != nil {
		return fmt.Errorf("create streams: %w", err)
	}

	env := Env{URL: url, DataDir: cfg.DataDir}
	env.Processes = plan(cfg, dep, url, dataDir, flagProbe(ctx, bins))
	if api := filepath.Join(cfg.BinDir, "warden"); cfg.APIAddr != "" && fileExists(api) { // operator's edit: warden api
		bins["api"] = api
		env.Processes = append(env.Processes, Process{Name: "api", Role: "api",
			Args: []string{"api", "--server", url, "--listen", cfg.APIAddr, "--anonymous-scope", "admin"}, MetricsURL: "http://" + cfg.APIAddr + "/metrics"})
	}
	if err := addressesFree(env.Processes); err != nil {
		return err
	}
	if err := writeAgentConfigs(filepath.Join(cfg.ConfigDir, "agent.yaml"), env.Processes); err != nil {
		return err
	}
	// Children outlive ctx on purpose: they are stopped explicitly, before
	// the server, when Run returns.
	childCtx, stopChildren := context.WithCancel(context.WithoutCancel(ctx))
	defer d.stopChildren(stopChildren)
	exited := make(chan *child, len(env.Processes))
	childEnv := childEnv(url, isTerminal(cfg.Out))
	for _, p := range env.Processes {
		c, err := start(childCtx, bins[p.Role], p, childEnv, d.out, d.width, cfg.ShutdownTimeout)
		if err != nil {
			return err
		}
		d.children = append(d.children, c)
		go func() { <-c.done; exited <- c }() // ends when the child does
		d.say("started %s (pid %d): %s %v", p.Name, c.cmd.Process.Pid, filepath.Base(bins[p.Role]), p.Args)
	}

	cl := client.New(js, client.Options{})
	err = d.phase(ctx, exited, cfg.ReadyTimeout, func(ctx context.Context) error {
		return cl.WaitForAgents(ctx, cfg.Pool, cfg.Agents)
	})
	if ctx.Err() != nil {
		return nil // interrupted while starting: a normal way to stop
	}
	if err != nil {
		return fmt.Errorf("waiting for %d agents: %w", cfg.Agents, err)
	}
	d.say("all %d agents are present", cfg.Agents)

	if cfg.OnReady != nil {
		err := d.phase(ctx, exited, 0, func(ctx context.Context) error { return cfg.OnReady(ctx, env) })
		if cfg.ExitAfterReady {
			return err
		}
		if err != nil && ctx.Err() == nil {
			d.say("demo: %v", err)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	d.banner(env)
	for {
		select {
		case <-ctx.Done():
			return nil
		case c := <-exited:
			// Killing an agent is a fair experiment in a dev sandbox: say
			// so and keep running.
			d.say("%s %s; the rest keeps running", c.Name, c.describe())
		}
	}
}

type devRun struct {
	cfg      Config
	out      *output
	width    int
	children []*child
}

func (d *devRun) say(format string, args ...any) {
	d.out.writeLine([]byte(fmt.Sprintf("%-*s | ", d.width, "warden")), []byte(fmt.Sprintf(format, args...)))
}

// phase runs f until it returns, failing early if a child exits or ctx
// ends. timeout 0 means no bound but ctx.
func (d *devRun) phase(ctx context.Context, exited <-chan *child, timeout time.Duration, f func(context.Context) error) error {
	pctx, cancel := context.WithCancel(ctx)
	if timeout > 0 {
		pctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f(pctx) }()
	select {
	case err := <-done:
		return err
	case c := <-exited:
		cancel()
		<-done
		return fmt.Errorf("%w: %s %s", ErrChildExited, c.Name, c.describe())
	}
}

// stopChildren SIGTERMs every child and waits for all of them; each is
// killed if it outlives the shutdown timeout.
func (d *devRun) stopChildren(cancel context.CancelFunc) {
	if len(d.children) == 0 {
		cancel()
		return
	}
	d.say("stopping %d processes (SIGTERM, SIGKILL after %s)...", len(d.children), d.cfg.ShutdownTimeout)
	cancel()
	for _, c := range d.children {
		<-c.done
		d.say("%s %s", c.Name, c.describe())
	}
}

func (d *devRun) stopServer(srv *server.Server) {
	srv.Shutdown()
	srv.WaitForShutdown()
	d.say("NATS server stopped")
}

// portFree fails fast, with the fix in the message, when the server's port
// is taken: the server itself would only time out.
func portFree(host string, port int) error {
	if port <= 0 {
		return nil
	}
	if err := listenable(net.JoinHostPort(host, strconv.Itoa(port))); err != nil {
		return fmt.Errorf("port %d is in use (another `warden dev` or nats-server?); stop it or pass --port: %w", port, err)
	}
	return nil
}

// addressesFree fails fast, naming the flag to change, when a child's
// metrics address (or the API's, whose /metrics is its own address) is
// taken: the child would exit at start and take the whole sandbox down
// with "child process exited".
func addressesFree(procs []Process) error {
	for _, p := range procs {
		if p.MetricsURL == "" {
			continue
		}
		addr := strings.TrimSuffix(strings.TrimPrefix(p.MetricsURL, "http://"), "/metrics")
		flag := "--metrics-port with a free range (or 0 for none)"
		if p.Role == "api" {
			flag = `--api with a free address (or "" for none)`
		}
		if err := listenable(addr); err != nil {
			return fmt.Errorf("%s's address %s is in use; pass %s: %w", p.Name, addr, flag, err)
		}
	}
	return nil
}

func listenable(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return l.Close()
}

func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	return ok && isatty.IsTerminal(f.Fd())
}

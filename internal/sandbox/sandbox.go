package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/embedded"
	"github.com/wardenhq/warden/internal/retry"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// System is a running in-process Warden. Close stops it and deletes its
// data.
type System struct {
	// URL is the embedded server's client URL.
	URL string
	// JS is a JetStream context on the sandbox's own connection.
	JS jetstream.JetStream

	srv    *server.Server
	dir    string
	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	conns  []*nats.Conn
}

// Start starts the server, applies the streams and runs a scheduler and a
// supervisor until Close.
func Start() (*System, error) {
	dir, err := os.MkdirTemp("", "warden-sandbox-")
	if err != nil {
		return nil, err
	}
	srv, err := embedded.Start(embedded.Options{Port: -1, StoreDir: dir, ServerName: "sandbox"})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &System{URL: srv.ClientURL(), srv: srv, dir: dir, ctx: ctx, cancel: cancel}
	if err := s.start(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *System) start(ctx context.Context) error {
	nc, err := s.Conn("sandbox")
	if err != nil {
		return err
	}
	if s.JS, err = jetstream.New(nc); err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := streams.Ensure(sctx, s.JS, streams.Options{}); err != nil {
		return err
	}
	rc := retry.DefaultConfig()
	rc.Default.BaseBackoff = protocol.Duration(50 * time.Millisecond)
	scfg := scheduler.DefaultConfig()
	scfg.Retry = &rc
	snc, err := s.Conn("scheduler")
	if err != nil {
		return err
	}
	sched, err := scheduler.New(scfg, snc, scheduler.WithLogger(zerolog.Nop()))
	if err != nil {
		return err
	}
	s.run(ctx, sched.Run)
	if err := schedulerReady(ctx, snc); err != nil {
		return err
	}
	vnc, err := s.Conn("supervisor")
	if err != nil {
		return err
	}
	sup, err := supervisor.New(supervisor.DefaultConfig(), vnc, zerolog.Nop(), nil)
	if err != nil {
		return err
	}
	s.run(ctx, sup.Run)
	return nil
}

// schedulerReady returns once a scheduler answers advance requests, the
// last thing it starts: then it consumes every partition too.
func schedulerReady(ctx context.Context, nc *nats.Conn) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := nc.RequestWithContext(rctx, protocol.SubjectControlAdvance, []byte("sandbox-probe"))
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("scheduler not ready after 10s: %w", err)
		}
		time.Sleep(20 * time.Millisecond) // no responders answers at once
	}
}

func (s *System) run(ctx context.Context, f func(context.Context) error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := f(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "sandbox:", err)
		}
	}()
}

// Conn opens a connection to the sandbox's server, closed by Close.
func (s *System) Conn(name string) (*nats.Conn, error) {
	nc, err := nats.Connect(s.URL, nats.Name(name))
	if err != nil {
		return nil, fmt.Errorf("connect to the sandbox: %w", err)
	}
	s.conns = append(s.conns, nc)
	return nc, nil
}

// Agent starts an SDK agent with cfg (TaskShards and a logger filled in)
// after register added its handlers, and returns once it takes tasks. It
// stops at Close.
func (s *System) Agent(cfg agent.Config, register func(*agent.Agent)) (*agent.Agent, error) {
	nc, err := s.Conn("agent " + cfg.ID)
	if err != nil {
		return nil, err
	}
	a, err := agent.New(cfg, agent.WithConn(nc), agent.WithLogger(zerolog.Nop()))
	if err != nil {
		return nil, err
	}
	if register != nil {
		register(a)
	}
	done := make(chan error, 1)
	s.wg.Add(1)
	ctx, cancel := context.WithCancel(s.ctx)
	go func() {
		defer s.wg.Done()
		done <- a.Run(ctx)
	}()
	select {
	case <-a.Ready():
		context.AfterFunc(ctx, cancel) // ctx ends with s.ctx, at Close
		return a, nil
	case err := <-done:
		cancel()
		return nil, errors.Join(errors.New("agent stopped while starting"), err)
	case <-time.After(10 * time.Second):
		cancel()
		return nil, errors.New("agent not ready after 10s")
	}
}

// Close stops the agents, the scheduler, the supervisor and the server, and
// deletes the data.
func (s *System) Close() {
	s.cancel()
	s.wg.Wait()
	for _, nc := range s.conns {
		nc.Close()
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	_ = os.RemoveAll(s.dir)
}

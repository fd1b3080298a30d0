package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// FleetConfig configures a fleet: many agents in this process sharing a
// few connections. Every agent is the real SDK runtime (pkg/agent, as users
// run it: presence, its durable task consumer, lease keeping, control
// subject, result before ack) with two handlers: "noop" returns at once,
// "hold" runs until its context ends (a cancel, the deadline or shutdown).
// Only the handlers and the logger differ from a deployed agent.
type FleetConfig struct {
	URL  string
	Pool string
	// Prefix names the agents <prefix>-<n>. Defaults to "la".
	Prefix string
	Agents int
	// Shards must match the scheduler's task_shards.
	Shards int
	// MaxConcurrent is each agent's max_concurrent. Defaults to 4.
	MaxConcurrent int
	// AgentsPerConn is how many agents share a connection. Defaults to 250.
	AgentsPerConn int
	// Heartbeat is the presence interval. Defaults to the SDK's (1s).
	Heartbeat time.Duration
	// Lease is the task consumer's ack wait. Defaults to the SDK's (10s).
	Lease time.Duration
	// OnTask is called when a handler starts (for latency measurements).
	OnTask func(job string, at time.Time)
}

// Fleet is a running set of SDK agents.
type Fleet struct {
	cfg    FleetConfig
	conns  []*nats.Conn
	agents []*agent.Agent
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startConcurrency bounds agents starting at once (each makes a few
// requests: consumer, bucket, presence).
const startConcurrency = 32

// StartFleet connects and starts every agent, returning once all are ready
// (consuming and announced) or one failed.
func StartFleet(ctx context.Context, cfg FleetConfig) (*Fleet, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "la"
	}
	if cfg.Pool == "" {
		cfg.Pool = "default"
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 4
	}
	if cfg.AgentsPerConn <= 0 {
		cfg.AgentsPerConn = 250
	}
	if cfg.Shards <= 0 {
		cfg.Shards = streams.DefaultTaskShards
	}
	runCtx, cancel := context.WithCancel(context.Background())
	f := &Fleet{cfg: cfg, cancel: cancel}
	nconns := (cfg.Agents + cfg.AgentsPerConn - 1) / cfg.AgentsPerConn
	for i := range nconns {
		nc, err := nats.Connect(cfg.URL, nats.Name(fmt.Sprintf("bench-fleet-%d", i)), nats.MaxReconnects(-1),
			nats.ReconnectBufSize(64<<20))
		if err != nil {
			f.Stop()
			return nil, err
		}
		f.conns = append(f.conns, nc)
	}
	log := zerolog.New(io.Discard).Level(zerolog.Disabled)
	noop := func(_ context.Context, t *agent.Task) (any, error) {
		if cfg.OnTask != nil {
			cfg.OnTask(t.JobID, time.Now())
		}
		return nil, nil
	}
	hold := func(ctx context.Context, t *agent.Task) (any, error) {
		if cfg.OnTask != nil {
			cfg.OnTask(t.JobID, time.Now())
		}
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}
	for i := range cfg.Agents {
		ac := agent.Config{ID: fmt.Sprintf("%s-%d", cfg.Prefix, i), Pool: cfg.Pool, MaxConcurrent: cfg.MaxConcurrent,
			TaskShards: cfg.Shards, HeartbeatInterval: protocol.Duration(cfg.Heartbeat), Lease: protocol.Duration(cfg.Lease),
			Actions: []string{"noop", "hold"}}
		a, err := agent.New(ac, agent.WithConn(f.conns[i/cfg.AgentsPerConn]), agent.WithLogger(log))
		if err != nil {
			f.Stop()
			return nil, err
		}
		a.Handle("noop", noop)
		a.Handle("hold", hold)
		f.agents = append(f.agents, a)
	}
	// Start with a bounded number of agents starting at once; each runs
	// until Stop.
	sem := make(chan struct{}, startConcurrency)
	errc := make(chan error, 1)
	fail := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	var starting sync.WaitGroup
	for _, a := range f.agents {
		select {
		case sem <- struct{}{}:
		case err := <-errc:
			starting.Wait()
			f.Stop()
			return nil, err
		case <-ctx.Done():
			starting.Wait()
			f.Stop()
			return nil, ctx.Err()
		}
		ran := make(chan error, 1)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			ran <- a.Run(runCtx)
		}()
		starting.Add(1)
		go func() {
			defer starting.Done()
			defer func() { <-sem }()
			select {
			case <-a.Ready():
			case err := <-ran:
				if err == nil {
					err = errors.New("stopped before it was ready")
				}
				fail(fmt.Errorf("agent %s: %w", a.Config().ID, err))
			case <-ctx.Done():
				fail(ctx.Err())
			}
		}()
	}
	starting.Wait()
	select {
	case err := <-errc:
		f.Stop()
		return nil, err
	default:
	}
	return f, nil
}

// IDs returns the agents' ids.
func (f *Fleet) IDs() []string {
	out := make([]string, len(f.agents))
	for i, a := range f.agents {
		out[i] = a.Config().ID
	}
	return out
}

// Handled is the number of results the agents reported.
func (f *Fleet) Handled() uint64 {
	var n uint64
	for _, a := range f.agents {
		s := a.Stats()
		n += s.Succeeded + s.Failed
	}
	return n
}

// Stop stops every agent (each drains and deletes its presence, as on a
// clean shutdown), then closes the connections.
func (f *Fleet) Stop() {
	f.cancel()
	done := make(chan struct{})
	go func() { f.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
	}
	for _, nc := range f.conns {
		nc.Close()
	}
}

// Command testagent is a Warden agent for end-to-end and chaos tests. Its
// handlers record every execution in a ledger file (one line per run:
// job step epoch agent pid unix-millis), so a test can count executions independently of
// the job store.
//
// Actions:
//
//	ledger  record, then sleep params.duration (default 0)
//	flaky   record, then fail as retriable when params.fail_attempts >= attempt
//	chance  record, then fail as retriable with probability params.fail_rate
//	crash   record, then kill the whole agent process (a poison task),
//	        unless <ledger>.fixed exists
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "testagent:", err)
		os.Exit(1)
	}
}

type ledger struct {
	mu sync.Mutex
	f  *os.File
	id string
}

// record appends one line and syncs it, so a kill -9 right after loses
// nothing the test will count.
func (l *ledger) record(t *agent.Task) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := fmt.Fprintf(l.f, "%s %s %d %s %d %d\n", t.JobID, t.StepID, t.Epoch, l.id, os.Getpid(), time.Now().UnixMilli()); err != nil {
		return err
	}
	return l.f.Sync()
}

func run(ctx context.Context) error {
	server := flag.String("server", "", "NATS URL")
	id := flag.String("id", "", "agent id")
	pool := flag.String("pool", "default", "pool")
	caps := flag.String("capabilities", "", "comma-separated capabilities")
	maxConc := flag.Int("max-concurrent", 4, "tasks at once")
	path := flag.String("ledger", os.Getenv("WARDEN_LEDGER"), "ledger file")
	clusterName := flag.String("cluster", "", "agent cluster to join (docs/clusters.md)")
	failEvery := flag.Int("fail", 0, "make ledger fail (retriable) on all but every Nth execution: a sick agent")
	flag.Parse()
	if *path == "" {
		return errors.New("--ledger is required")
	}
	f, err := os.OpenFile(*path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	l := &ledger{f: f, id: *id}

	cfg := agent.DefaultConfig()
	cfg.NATS.URL, cfg.ID, cfg.Pool, cfg.MaxConcurrent = *server, *id, *pool, *maxConc
	cfg.Cluster = *clusterName
	if *caps != "" {
		cfg.Capabilities = strings.Split(*caps, ",")
	}
	cfg.Actions = []string{"ledger", "flaky", "chance", "crash"}
	cfg.FetchWait = protocol.Duration(2 * time.Second)
	// A short lease makes a crashed agent's redeliveries come quickly.
	cfg.Lease = protocol.Duration(2 * time.Second)
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	var sick atomic.Int64
	a.Handle("ledger", func(ctx context.Context, t *agent.Task) (any, error) {
		var p struct {
			Duration protocol.Duration `json:"duration"`
		}
		if err := t.Bind(&p); err != nil {
			return nil, err
		}
		if err := l.record(t); err != nil {
			return nil, agent.Retriable(err)
		}
		select {
		case <-time.After(p.Duration.Std()):
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		if *failEvery > 0 && sick.Add(1)%int64(*failEvery) != 0 {
			return nil, agent.Retriable(errors.New("disk unavailable on this host"))
		}
		return map[string]string{"agent": *id}, nil
	})
	a.Handle("flaky", func(ctx context.Context, t *agent.Task) (any, error) {
		var p struct {
			FailAttempts int `json:"fail_attempts"`
		}
		if err := t.Bind(&p); err != nil {
			return nil, err
		}
		if err := l.record(t); err != nil {
			return nil, agent.Retriable(err)
		}
		if t.Attempt <= p.FailAttempts {
			return nil, agent.Retriable(fmt.Errorf("temporary glitch on attempt %d", t.Attempt))
		}
		return "ok", nil
	})
	a.Handle("chance", func(ctx context.Context, t *agent.Task) (any, error) {
		var p struct {
			FailRate float64 `json:"fail_rate"`
		}
		if err := t.Bind(&p); err != nil {
			return nil, err
		}
		if err := l.record(t); err != nil {
			return nil, agent.Retriable(err)
		}
		// Deterministic per execution, so a run is reproducible.
		h := fnv.New64a()
		fmt.Fprintf(h, "%s/%s/%d", t.JobID, t.StepID, t.Epoch)
		if float64(h.Sum64()%10000)/10000 < p.FailRate {
			return nil, agent.Retriable(errors.New("temporarily unavailable"))
		}
		return "ok", nil
	})
	a.Handle("crash", func(ctx context.Context, t *agent.Task) (any, error) {
		_ = l.record(t)
		// An operator "fixes" the poison by creating <ledger>.fixed.
		if _, err := os.Stat(*path + ".fixed"); err == nil {
			return "fixed", nil
		}
		os.Exit(3)
		return nil, nil
	})
	return a.Run(ctx)
}

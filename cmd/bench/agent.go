package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/wardenhq/warden/pkg/agent"
)

// runAgent is a real Warden agent (pkg/agent, default settings) with one
// action for the failover phase: "hold" blocks on the first dispatch of a
// step (epoch 1), as a long task would, and returns at once on a later
// epoch, so a transferred step completes as soon as it runs elsewhere.
func runAgent(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench agent", flag.ContinueOnError)
	server := fs.String("server", "", "NATS URL")
	id := fs.String("id", "", "agent id")
	pool := fs.String("pool", "default", "pool")
	maxConcurrent := fs.Int("max-concurrent", 1, "tasks at once")
	shards := fs.Int("task-shards", 0, "task shards (default 4)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := agent.Config{ID: *id, Pool: *pool, MaxConcurrent: *maxConcurrent, TaskShards: *shards, Actions: []string{"hold"}}
	cfg.NATS.URL = *server
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	a.Handle("hold", func(ctx context.Context, t *agent.Task) (any, error) {
		if t.Epoch > 1 {
			return map[string]any{"took_over": true}, nil
		}
		fmt.Fprintf(os.Stdout, "BENCH-HOLDING %s %s\n", t.JobID, *id)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Minute):
			return nil, nil
		}
	})
	return a.Run(ctx)
}

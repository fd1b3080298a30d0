// Command agent runs a Warden agent with the built-in actions (echo, sleep,
// shell, http). Programs with their own actions embed pkg/agent instead.
//
// Exit codes: 0 after a clean drain, 1 on any error (including another live
// agent with the same id, which the message names).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/config"
)

func main() {
	// SIGINT/SIGTERM start the drain; a second signal kills at once, since
	// stop() restores the default handling.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "warden agent:", err)
		os.Exit(1)
	}
}

// run loads the configuration (flags > environment > file > defaults) and
// runs the agent until ctx ends.
func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	path := fs.String("config", "", "YAML configuration file (see configs/agent.yaml)")
	server := fs.String("server", "", "NATS server URL(s) (env NATS_URL)")
	creds := fs.String("creds", "", "NATS credentials file (env NATS_CREDS)")
	id := fs.String("id", "", "agent id (default: the host name)")
	pool := fs.String("pool", "", "pool to serve (default \"default\")")
	caps := fs.String("capabilities", "", "comma-separated capabilities")
	maxConcurrent := fs.Int("max-concurrent", 0, "tasks run at once (default 4)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}

	var cfg agent.Config
	if err := config.Load(*path, &cfg); err != nil {
		return err
	}
	if v := os.Getenv("NATS_URL"); v != "" {
		cfg.NATS.URL = v
	}
	if v := os.Getenv("NATS_CREDS"); v != "" {
		cfg.NATS.Creds = v
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "server":
			cfg.NATS.URL = *server
		case "creds":
			cfg.NATS.Creds = *creds
		case "id":
			cfg.ID = *id
		case "pool":
			cfg.Pool = *pool
		case "capabilities":
			cfg.Capabilities = splitList(*caps)
		case "max-concurrent":
			cfg.MaxConcurrent = *maxConcurrent
		}
	})

	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

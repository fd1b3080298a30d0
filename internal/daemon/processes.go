package daemon

import (
	"context"
	"flag"
	"fmt"
	"net"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/api"
	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/streams"
)

// Scheduler turns submissions into jobs, dispatches ready steps and consumes
// results.
var Scheduler = Process[scheduler.Config]{
	Name: "scheduler",
	Summary: "Turns submissions into jobs, dispatches ready steps and consumes results.\n" +
		"Run as many as you like against the same NATS: they share the partitions.",
	Default: scheduler.DefaultConfig,
	Common: func(c *scheduler.Config) Common {
		return Common{NATS: &c.NATS, TaskShards: &c.TaskShards, Partitions: &c.Partitions, MetricsAddr: &c.MetricsAddr, LogLevel: &c.LogLevel,
			GCPercent: &c.GCPercent, PprofAddr: &c.PprofAddr}
	},
	Finish: func(c *scheduler.Config) error { *c = c.WithDefaults(); return c.Validate() },
	Serve: func(ctx context.Context, c scheduler.Config, env Env) error {
		s, err := scheduler.New(c, env.Conn, scheduler.WithLogger(env.Log), scheduler.WithMetrics(scheduler.NewMetrics(env.Registry)))
		if err != nil {
			return err
		}
		// Recurring jobs: every scheduler relays fired schedule ticks.
		js, err := jetstream.New(env.Conn)
		if err != nil {
			return err
		}
		relay := schedule.NewRelay(js, schedule.WithLogger(env.Log),
			schedule.WithStreams(streams.Options{Replicas: c.Replicas, TaskShards: c.TaskShards}))
		if err := relay.Start(ctx); err != nil {
			return err
		}
		defer relay.Stop()
		return s.Run(ctx)
	},
}

// Supervisor recovers what fails; run two or more, one leads.
var Supervisor = Process[supervisor.Config]{
	Name: "supervisor",
	Summary: "Recovers what fails: expired leases, failed agents, poison tasks, unhealthy agents.\n" +
		"Run two or more against the same NATS: one leads, the others stand by.",
	Default: supervisor.DefaultConfig,
	Common: func(c *supervisor.Config) Common {
		return Common{NATS: &c.NATS, ID: &c.ID, TaskShards: &c.TaskShards, Partitions: &c.Partitions, MetricsAddr: &c.MetricsAddr, LogLevel: &c.LogLevel,
			PprofAddr: &c.PprofAddr}
	},
	Finish: func(c *supervisor.Config) error { *c = c.WithDefaults(); return c.Validate() },
	Serve: func(ctx context.Context, c supervisor.Config, env Env) error {
		s, err := supervisor.New(c, env.Conn, env.Log, supervisor.NewMetrics(env.Registry))
		if err != nil {
			return err
		}
		return s.Run(ctx)
	},
}

// API serves the HTTP API, the dashboard and the warden-api micro service
// (`warden api`).
var API = Process[api.Config]{
	Name: "api",
	Summary: "Serves the HTTP API (/api/v1), the web dashboard (/), /metrics, /healthz and /readyz\n" +
		"on --listen, and registers the warden-api NATS micro service (nats micro ls).\n" +
		"Runs until Ctrl-C or SIGTERM. See docs/api.md and configs/api.yaml.",
	Default: api.DefaultConfig,
	Common: func(c *api.Config) Common {
		return Common{NATS: &c.NATS, LogLevel: &c.LogLevel, ConnectsItself: true}
	},
	Flags: func(fs *flag.FlagSet, c *api.Config) {
		fs.StringVar(&c.Listen, "listen", c.Listen, "HTTP address of the API, dashboard and /metrics")
		fs.Func("anonymous-scope", "what requests without a token may do: read or admin (default nothing)", func(s string) error {
			c.AnonymousScope = api.Scope(s)
			return nil
		})
	},
	Finish: func(c *api.Config) error {
		if _, _, err := net.SplitHostPort(c.Listen); err != nil {
			return fmt.Errorf("listen %q: %w", c.Listen, err)
		}
		*c = c.WithDefaults()
		return c.Validate()
	},
	Serve: func(ctx context.Context, c api.Config, env Env) error { return api.Run(ctx, c, env.Log, nil) },
}

// Agent runs the built-in actions (echo, sleep, shell, http). Programs with
// their own actions embed pkg/agent instead.
var Agent = Process[agent.Config]{
	Name: "agent",
	Summary: "Runs tasks with the built-in actions (echo, sleep, shell, http); programs with\n" +
		"their own actions embed pkg/agent. Exits 0 after a clean drain, 1 on any error\n" +
		"(including another live agent with the same id, which the message names).",
	Default: agent.DefaultConfig,
	Common: func(c *agent.Config) Common {
		return Common{NATS: &c.NATS, ID: &c.ID, TaskShards: &c.TaskShards, MetricsAddr: &c.MetricsAddr, LogLevel: &c.LogLevel,
			ServesOwnMetrics: true}
	},
	Flags: func(fs *flag.FlagSet, c *agent.Config) {
		fs.StringVar(&c.Pool, "pool", c.Pool, "pool to serve")
		fs.Func("capabilities", "comma-separated capabilities (replaces the file's list)", func(s string) error {
			c.Capabilities = splitList(s)
			return nil
		})
		fs.IntVar(&c.MaxConcurrent, "max-concurrent", c.MaxConcurrent, "tasks run at once")
		fs.StringVar(&c.Cluster, "cluster", c.Cluster, "agent cluster to join (docs/clusters.md)")
	},
	Finish:   func(c *agent.Config) error { *c = c.WithDefaults(); return c.Validate() },
	ConnName: func(c agent.Config) string { return "warden-agent " + c.Pool + "." + c.ID },
	Serve: func(ctx context.Context, c agent.Config, env Env) error {
		a, err := agent.New(c, agent.WithConn(env.Conn), agent.WithLogger(env.Log))
		if err != nil {
			return err
		}
		return a.Run(ctx)
	},
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

package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/internal/dev"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/client"
)

type devFlags struct {
	cfg         dev.Config
	demo        string
	demoTimeout time.Duration
}

func (a *app) devCommand() *cobra.Command {
	var f devFlags
	cmd := &cobra.Command{
		Use:   "dev [--demo FILE]",
		Short: "Run all of Warden locally: embedded NATS, scheduler, supervisor and agents",
		Long: `dev starts an embedded NATS server with JetStream (data in --data), creates
Warden's streams and buckets, and runs one scheduler, one supervisor and
--agents agents (agent-1 has capabilities linux,docker, the others linux) as
child processes. The binaries are taken from the directory of the warden
executable (bin/ after make build), or --bin-dir.

With --demo FILE it submits that job once the agents are up, follows it to
its end and prints the result. It keeps running until Ctrl-C or SIGTERM,
then stops the children (SIGTERM, then SIGKILL after --shutdown-timeout) and
the server. The global --server, --creds and --timeout flags do not apply.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.dev(cmd.Context(), f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.cfg.DataDir, "data", ".warden", "directory for the server's JetStream data")
	fl.StringVar(&f.cfg.Host, "host", "127.0.0.1", "address the NATS server listens on")
	fl.IntVar(&f.cfg.Port, "port", 4222, "NATS client port (-1 picks a free one)")
	fl.IntVar(&f.cfg.Agents, "agents", 3, "number of agents")
	fl.StringVar(&f.cfg.Pool, "pool", "default", "pool the agents join")
	fl.IntVar(&f.cfg.TaskShards, "task-shards", 0, "task streams to create (default: the streams package's)")
	fl.IntVar(&f.cfg.MetricsPort, "metrics-port", 9300, "first /metrics port: scheduler, supervisor, then agents (0: none)")
	fl.StringVar(&f.cfg.APIAddr, "api", "127.0.0.1:8080", "where warden api serves the HTTP API and dashboard, open to anyone who can reach it (empty: not started)")
	fl.StringVar(&f.cfg.BinDir, "bin-dir", "", "directory of the scheduler, supervisor and agent binaries (default: warden's own)")
	fl.StringVar(&f.cfg.ConfigDir, "config-dir", "", "directory of scheduler.yaml, supervisor.yaml, agent.yaml (default: <bin-dir>/../configs)")
	fl.DurationVar(&f.cfg.ShutdownTimeout, "shutdown-timeout", 15*time.Second, "how long a child may take to stop after SIGTERM")
	fl.DurationVar(&f.cfg.ReadyTimeout, "ready-timeout", 30*time.Second, "how long to wait for every agent to be present")
	fl.StringVar(&f.demo, "demo", "", "job spec to submit and follow once everything is up")
	fl.DurationVar(&f.demoTimeout, "demo-timeout", 2*time.Minute, "bound on the demo job")
	fl.BoolVar(&f.cfg.ExitAfterReady, "exit-after-demo", false, "stop everything after the demo and exit with its result (for scripts)")
	return cmd
}

func (a *app) dev(ctx context.Context, f devFlags) error {
	f.cfg.Out = a.stdout
	if f.demo != "" {
		body, err := a.readSpec(f.demo)
		if err != nil {
			return err
		}
		f.cfg.OnReady = func(ctx context.Context, env dev.Env) error {
			ctx, cancel := context.WithTimeout(ctx, f.demoTimeout)
			defer cancel()
			return a.demo(ctx, env, body)
		}
	} else if f.cfg.ExitAfterReady {
		f.cfg.OnReady = func(context.Context, dev.Env) error { return nil }
	}
	err := dev.Run(ctx, f.cfg)
	if errors.Is(err, dev.ErrMissingBinary) {
		return &exitError{code: exitUsage, err: err}
	}
	return err
}

// demo submits the demo job on the embedded server and follows it, printing
// what `warden submit --wait` prints, then the job's result.
func (a *app) demo(ctx context.Context, env dev.Env, body []byte) error {
	// Not natsconn: the embedded server has no authentication, so a
	// NATS_CREDS in the environment must not be used.
	nc, err := nats.Connect(env.URL, nats.Name("warden-dev-demo"))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", env.URL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	c := client.New(js, client.Options{})
	r, err := c.Submit(ctx, body, client.SubmitOptions{})
	if err != nil {
		return fmt.Errorf("submit demo job: %w", err)
	}
	fmt.Fprintf(a.stdout, "\ndemo: submitted job %s (%s); following it:\n", r.JobID, r.Name)
	job, err := c.Follow(ctx, r.JobID, newProgress(a.stdout).update)
	if err != nil {
		return fmt.Errorf("follow demo job %s: %w", r.JobID, err)
	}
	d, err := c.Job(ctx, job.ID)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "\ndemo: result of job %s:\n", job.ID)
	printJob(a, d, time.Now())
	fmt.Fprintln(a.stdout)
	if job.State != jobstore.JobSucceeded {
		return &exitError{code: exitJobFailed, err: fmt.Errorf("demo job %s %s: %s", job.ID, job.State, job.Error)}
	}
	return nil
}

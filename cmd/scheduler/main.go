// Command scheduler turns submissions into jobs, dispatches ready steps and
// consumes results. Run as many as you like against the same NATS.
package main

import (
	"context"
	"flag"

	"github.com/wardenhq/warden/pkg/daemon"
	"github.com/wardenhq/warden/pkg/metrics"
	"github.com/wardenhq/warden/pkg/scheduler"
)

func main() { daemon.Main(run) }

func run(ctx context.Context, args []string) error {
	var common daemon.Common
	fs := flag.NewFlagSet("scheduler", flag.ContinueOnError)
	common.Register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := scheduler.DefaultConfig()
	if err := common.Load(&cfg); err != nil {
		return err
	}
	common.Apply(&cfg.NATS)
	if common.MetricsAddr != "" {
		cfg.MetricsAddr = common.MetricsAddr
	}
	if common.LogLevel != "" {
		cfg.LogLevel = common.LogLevel
	}
	cfg = cfg.WithDefaults()
	log := daemon.Logger("scheduler", cfg.LogLevel)
	nc, err := daemon.Connect(cfg.NATS, "warden-scheduler", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	reg := metrics.NewRegistry()
	if err := daemon.ServeMetrics(ctx, cfg.MetricsAddr, reg, log); err != nil {
		return err
	}
	s, err := scheduler.New(cfg, nc, scheduler.WithLogger(log), scheduler.WithMetrics(scheduler.NewMetrics(reg)))
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

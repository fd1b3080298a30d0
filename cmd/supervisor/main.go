// Command supervisor recovers what fails: run two or more; one leads.
package main

import (
	"context"
	"flag"

	"github.com/wardenhq/warden/pkg/daemon"
	"github.com/wardenhq/warden/pkg/metrics"
	"github.com/wardenhq/warden/pkg/supervisor"
)

func main() { daemon.Main(run) }

func run(ctx context.Context, args []string) error {
	var common daemon.Common
	fs := flag.NewFlagSet("supervisor", flag.ContinueOnError)
	common.Register(fs)
	id := fs.String("id", "", "supervisor id in the lease (default <host>-<random>)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := supervisor.DefaultConfig()
	if err := common.Load(&cfg); err != nil {
		return err
	}
	common.Apply(&cfg.NATS)
	if *id != "" {
		cfg.ID = *id
	}
	if common.MetricsAddr != "" {
		cfg.MetricsAddr = common.MetricsAddr
	}
	if common.LogLevel != "" {
		cfg.LogLevel = common.LogLevel
	}
	log := daemon.Logger("supervisor", cfg.LogLevel)
	nc, err := daemon.Connect(cfg.NATS, "warden-supervisor", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	reg := metrics.NewRegistry()
	if err := daemon.ServeMetrics(ctx, cfg.MetricsAddr, reg, log); err != nil {
		return err
	}
	s, err := supervisor.New(cfg, nc, log, supervisor.NewMetrics(reg))
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

package api

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/metrics"
	"github.com/wardenhq/warden/internal/natsconn"
	"github.com/wardenhq/warden/internal/ops"
)

// Run is the `warden api` process: it connects to NATS with its own
// identity (Config.NATS), keeps an index of the jobs for listings,
// registers the warden-api micro service, and serves the API, the
// dashboard, /metrics, /healthz and /readyz on Config.Listen until ctx
// ends. ready (may be nil) receives the bound address.
func Run(ctx context.Context, cfg Config, log zerolog.Logger, ready func(addr string)) error {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	conn := cfg.NATS
	conn.Name = "warden-api"
	nc, js, err := natsconn.Connect(conn, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		return fmt.Errorf("the job store is not there (has a scheduler ever started?): %w", err)
	}
	// Listings (GET /api/v1/jobs, the micro jobs.list) are answered from
	// an in-memory index of the job records' headers, kept current by
	// following the job keys; a listing scans while it is being built or
	// is behind (jobstore.Index). Stopped, and waited for, before the
	// connection closes.
	ix := jobstore.NewIndex(store, js, jobstore.IndexConfig{Logger: log})
	store.UseIndex(ix)
	defer background(ctx, ix.Run)()
	o := ops.New(nc, store)
	reg := metrics.NewRegistry()
	reg.MustRegister(ops.NewCollector(o, log))
	// The metrics feed follows the job keys and WARDEN_EVENTS; like the
	// index it is stopped, and waited for, before the connection closes.
	feed := ops.NewFeed(o, reg, log)
	defer background(ctx, func(ctx context.Context) {
		if err := feed.Run(ctx); err != nil {
			log.Warn().Err(err).Msg("metrics feed stopped")
		}
	})()
	srv, err := New(cfg, nc, o, WithLogger(log), WithGatherer(reg))
	if err != nil {
		return err
	}
	if *cfg.Micro {
		svc, err := ops.RegisterMicro(nc, o, ops.ServiceAPI, true)
		if err != nil {
			return fmt.Errorf("register micro service: %w", err)
		}
		defer func() { _ = svc.Stop() }()
	}
	return srv.Run(ctx, ready)
}

// background runs fn in a goroutine on a context of its own and returns
// the function that cancels it and waits for fn to return.
func background(ctx context.Context, fn func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

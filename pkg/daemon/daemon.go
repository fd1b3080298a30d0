// Package daemon holds what every long-running Warden process does at
// start: read --config, --server/NATS_URL and --creds/NATS_CREDS, build the
// logger, connect, serve /metrics, and turn SIGINT/SIGTERM into a cancelled
// context. cmd/*/main.go stays a few lines.
package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/config"
	"github.com/wardenhq/warden/pkg/logging"
	"github.com/wardenhq/warden/pkg/metrics"
	"github.com/wardenhq/warden/pkg/natsconn"
)

// Common are the flags every process takes.
type Common struct {
	ConfigPath  string
	Server      string
	Creds       string
	MetricsAddr string
	LogLevel    string
}

// Register adds the common flags to fs.
func (c *Common) Register(fs *flag.FlagSet) {
	fs.StringVar(&c.ConfigPath, "config", "", "YAML configuration file (defaults apply to every field it omits)")
	fs.StringVar(&c.Server, "server", "", "NATS server URL (default $NATS_URL, then "+natsconn.DefaultURL+")")
	fs.StringVar(&c.Creds, "creds", "", "NATS credentials file (default $NATS_CREDS)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "serve Prometheus /metrics on this address (overrides the config)")
	fs.StringVar(&c.LogLevel, "log-level", "", "debug, info, warn or error (overrides the config)")
}

// Load reads the config file into dst (which holds defaults).
func (c *Common) Load(dst any) error { return config.Load(c.ConfigPath, dst) }

// Apply lets flags override connection settings from the file.
func (c *Common) Apply(o *natsconn.Options) {
	if c.Server != "" {
		o.URL = c.Server
	}
	if c.Creds != "" {
		o.Creds = c.Creds
	}
}

// Connect connects with the options and logs where to.
func Connect(o natsconn.Options, name string, log zerolog.Logger) (*nats.Conn, error) {
	o.Name = name
	nc, _, err := natsconn.Connect(o, log)
	if err != nil {
		return nil, err
	}
	log.Info().Str("server", natsconn.Redact(nc.ConnectedUrl())).Msg("connected to nats")
	return nc, nil
}

// Logger builds the process logger.
func Logger(component, level string) zerolog.Logger { return logging.New(component, level) }

// ServeMetrics serves reg on addr until ctx ends and logs where.
func ServeMetrics(ctx context.Context, addr string, reg *prometheus.Registry, log zerolog.Logger) error {
	bound, err := metrics.Serve(ctx, addr, reg)
	if err != nil {
		return fmt.Errorf("metrics on %s: %w", addr, err)
	}
	if bound != "" {
		log.Info().Str("addr", "http://"+bound+"/metrics").Msg("serving metrics")
	}
	return nil
}

// Main runs run with a context cancelled by SIGINT or SIGTERM and exits
// with 0 on success or after a signal, 1 on error. This is the only place
// signals are handled.
func Main(run func(ctx context.Context, args []string) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/internal/metrics"
	"github.com/wardenhq/warden/internal/natsconn"
)

// Process describes one long-running Warden process to Run: its config
// type C, where the settings every process shares live in C, and what it
// runs once connected.
type Process[C any] struct {
	// Name is the process's name: the --help usage line, the logger's
	// component and the NATS connection name ("warden-<name>").
	Name string
	// Summary is the paragraph --help prints under the usage line.
	Summary string
	// Default returns the configuration with every default filled in.
	Default func() C
	// Common points into c at the settings every process shares; a nil
	// pointer means the process has no such setting (and no such flag).
	Common func(c *C) Common
	// Flags registers the process's own flags, bound to fields of c.
	Flags func(fs *flag.FlagSet, c *C)
	// Finish fills what the resolved configuration derives (defaults of
	// fields left empty) and checks it; optional.
	Finish func(c *C) error
	// ConnName names the NATS connection; defaults to "warden-<name>".
	ConnName func(c C) string
	// Serve runs the process until ctx ends.
	Serve func(ctx context.Context, c C, env Env) error
}

// Common points at the settings every process shares.
type Common struct {
	NATS        *natsconn.Options
	ID          *string
	TaskShards  *int
	Partitions  *int
	MetricsAddr *string
	LogLevel    *string
	// GCPercent is the process's garbage collection target (GOGC); nil or
	// 0 leaves the Go default. GOGC in the environment wins over it.
	GCPercent *int
	// PprofAddr serves net/http/pprof; nil or empty: off.
	PprofAddr *string
	// ServesOwnMetrics says the process serves MetricsAddr itself (the
	// agent SDK does); otherwise the daemon serves Env.Registry there.
	ServesOwnMetrics bool
	// ConnectsItself says the process opens its own NATS connection from
	// the resolved config (Env.Conn is nil).
	ConnectsItself bool
}

// Env is what the daemon hands a running process.
type Env struct {
	Log      zerolog.Logger
	Conn     *nats.Conn
	Registry *prometheus.Registry
}

// Run resolves the configuration from args (flag > environment > file >
// default), connects to NATS, serves /metrics and runs the process until
// ctx ends. --help prints the usage and returns flag.ErrHelp;
// --print-config prints the resolved configuration as YAML and returns nil.
func (p Process[C]) Run(ctx context.Context, args []string) error {
	return p.run(ctx, args, os.Stdout, os.Stderr, os.LookupEnv)
}

func (p Process[C]) run(ctx context.Context, args []string, stdout, stderr io.Writer, env func(string) (string, bool)) error {
	cfg, printOnly, err := p.resolve(args, stdout, stderr, env)
	if err != nil || printOnly {
		return err
	}
	common := p.Common(&cfg)
	level := ""
	if common.LogLevel != nil {
		level = *common.LogLevel
	}
	log := logging.New(p.Name, level)
	if common.GCPercent != nil {
		setGCPercent(*common.GCPercent, env, log)
	}
	if common.PprofAddr != nil && *common.PprofAddr != "" {
		bound, err := servePprof(ctx, *common.PprofAddr)
		if err != nil {
			return fmt.Errorf("pprof on %s: %w", *common.PprofAddr, err)
		}
		log.Info().Str("addr", "http://"+bound+"/debug/pprof/").Msg("serving pprof")
	}
	if common.ConnectsItself {
		return p.Serve(ctx, cfg, Env{Log: log, Registry: metrics.NewRegistry()})
	}
	var opts natsconn.Options
	if common.NATS != nil {
		opts = *common.NATS
	}
	opts.Name = "warden-" + p.Name
	if p.ConnName != nil {
		opts.Name = p.ConnName(cfg)
	}
	nc, _, err := natsconn.Connect(opts, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	log.Info().Str("server", natsconn.Redact(nc.ConnectedUrl())).Msg("connected to nats")
	reg := metrics.NewRegistry()
	if common.MetricsAddr != nil && !common.ServesOwnMetrics {
		bound, err := metrics.Serve(ctx, *common.MetricsAddr, reg, metrics.Connected(nc)) // /readyz: connected (operator)
		if err != nil {
			return fmt.Errorf("metrics on %s: %w", *common.MetricsAddr, err)
		}
		if bound != "" {
			log.Info().Str("addr", "http://"+bound+"/metrics").Msg("serving metrics")
		}
	}
	return p.Serve(ctx, cfg, Env{Log: log, Conn: nc, Registry: reg})
}

// SignalContext returns a context cancelled by the first SIGINT or SIGTERM.
// After that first signal the default handling is back, so a second one
// kills the process at once (a drain that hangs can be cut short).
func SignalContext() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	return ctx, stop
}

// Exit ends the process: 0 for nil, --help, or a shutdown by signal; 1
// with the error on stderr otherwise.
func Exit(name string, err error) {
	if err == nil || errors.Is(err, flag.ErrHelp) || errors.Is(err, context.Canceled) {
		os.Exit(0)
	}
	fmt.Fprintf(os.Stderr, "warden-%s: %v\n", name, err)
	os.Exit(1)
}

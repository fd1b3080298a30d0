package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/wardenhq/warden/internal/config"
	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/internal/natsconn"
)

// EnvName is the environment variable that sets a flag: NATS_URL and
// NATS_CREDS for --server and --creds (as the nats CLI), WARDEN_<FLAG> for
// every other (--task-shards: WARDEN_TASK_SHARDS).
func EnvName(flagName string) string {
	switch flagName {
	case "server":
		return "NATS_URL"
	case "creds":
		return "NATS_CREDS"
	}
	return "WARDEN_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// noEnv are the flags no environment variable sets.
var noEnv = map[string]bool{"print-config": true}

// options are the flags about the command line itself, not the config.
type options struct {
	configPath  string
	printConfig bool
}

// resolve returns the configuration: defaults, then the --config file, then
// the environment, then the flags. It parses args twice: first against the
// defaults (so that --help shows them) to find --config, then against the
// configuration read from the file, so that a flag or an environment
// variable overrides the file only when it is set.
// The usage (--help, a bad flag) goes to usage, --print-config to out.
func (p Process[C]) resolve(args []string, out, usage io.Writer, env func(string) (string, bool)) (C, bool, error) {
	cfg, printOnly, err := p.resolveConfig(args, out, usage, env)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		err = &UsageError{Err: err}
	}
	return cfg, printOnly, err
}

// UsageError is a bad flag, environment variable or configuration: the
// process did not start.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

func (p Process[C]) resolveConfig(args []string, out, usage io.Writer, env func(string) (string, bool)) (C, bool, error) {
	def := p.Default()
	fs, opts := p.flagSet(&def, usage)
	if err := parse(fs, args, env); err != nil {
		return def, false, err
	}
	cfg := p.Default()
	if err := config.Load(opts.configPath, &cfg); err != nil {
		return cfg, false, err
	}
	fs, opts = p.flagSet(&cfg, io.Discard)
	if err := parse(fs, args, env); err != nil {
		return cfg, false, err
	}
	if cm := p.Common(&cfg); cm.LogLevel != nil {
		if err := logging.CheckLevel(*cm.LogLevel); err != nil {
			return cfg, false, fmt.Errorf("config: %w", err)
		}
	}
	if p.Finish != nil {
		if err := p.Finish(&cfg); err != nil {
			return cfg, false, fmt.Errorf("config: %w", err)
		}
	}
	if opts.printConfig {
		// Printed configs end up in tickets and chat: no secret in them.
		shown := cfg
		if r, ok := any(shown).(interface{ Redacted() C }); ok {
			shown = r.Redacted()
		}
		if cm := p.Common(&shown); cm.NATS != nil {
			// What the connection will use: NATS_CA and NATS_INBOX_PREFIX
			// beat the file's nats.ca and inbox_prefix (natsconn.Connect).
			*cm.NATS = cm.NATS.WithEnvFrom(env)
			cm.NATS.URL = natsconn.Redact(cm.NATS.URL)
		}
		enc := yaml.NewEncoder(out)
		enc.SetIndent(2)
		if err := enc.Encode(shown); err != nil {
			return cfg, false, err
		}
		return cfg, true, enc.Close()
	}
	return cfg, false, nil
}

// parse sets every flag whose environment variable is set, then parses args
// over them.
func parse(fs *flag.FlagSet, args []string, env func(string) (string, bool)) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if noEnv[f.Name] || err != nil {
			return
		}
		if v, ok := env(EnvName(f.Name)); ok && v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("environment %s=%q: %w", EnvName(f.Name), v, e)
			}
		}
	})
	if err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q (see --help)", fs.Args())
	}
	return nil
}

// flagSet returns the process's flags bound to the fields of c: the common
// ones every process has, then its own.
func (p Process[C]) flagSet(c *C, out io.Writer) (*flag.FlagSet, *options) {
	fs := flag.NewFlagSet(p.Name, flag.ContinueOnError)
	fs.SetOutput(out)
	var o options
	fs.StringVar(&o.configPath, "config", "", "YAML configuration file (see configs/"+p.Name+".yaml); settings it omits keep their defaults")
	fs.BoolVar(&o.printConfig, "print-config", false, "print the resolved configuration as YAML and exit")
	cm := p.Common(c)
	if cm.NATS != nil {
		fs.StringVar(&cm.NATS.URL, "server", cm.NATS.URL, "NATS server URL(s), comma separated (empty: nats://127.0.0.1:4222)")
		fs.StringVar(&cm.NATS.Creds, "creds", cm.NATS.Creds, "NATS credentials file")
	}
	if cm.ID != nil {
		fs.StringVar(cm.ID, "id", *cm.ID, "this process's id (default: derived from the host name)")
		// The default is computed per host: do not print it as if fixed.
		fs.Lookup("id").DefValue = ""
	}
	if cm.TaskShards != nil {
		fs.IntVar(cm.TaskShards, "task-shards", *cm.TaskShards, "number of task streams, about one per 50 agents; every scheduler, supervisor and agent of a deployment must use the same")
	}
	if cm.Partitions != nil {
		fs.IntVar(cm.Partitions, "partitions", *cm.Partitions, "scheduler partitions of submissions and results; every scheduler and supervisor of a deployment must use the same")
	}
	if cm.MetricsAddr != nil {
		fs.StringVar(cm.MetricsAddr, "metrics-addr", *cm.MetricsAddr, "serve Prometheus /metrics on this address (empty: off)")
	}
	if cm.LogLevel != nil {
		fs.StringVar(cm.LogLevel, "log-level", *cm.LogLevel, "debug, info, warn or error")
	}
	if p.Flags != nil {
		p.Flags(fs, c)
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !noEnv[f.Name] {
			f.Usage += " [env " + EnvName(f.Name) + "]"
		}
	})
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s [flags]\n\n%s\n\n", p.Name, p.Summary)
		fmt.Fprintf(fs.Output(), "Each setting is taken from, in order: its flag, its environment variable,\n"+
			"the --config file, the default. Flags:\n")
		fs.PrintDefaults()
	}
	return fs, &o
}

package daemon

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wardenhq/warden/internal/natsconn"
)

type toyConfig struct {
	NATS       natsconn.Options `yaml:"nats"`
	TaskShards int              `yaml:"task_shards"`
	LogLevel   string           `yaml:"log_level"`
	Metrics    string           `yaml:"metrics_addr"`
	Pool       string           `yaml:"pool"`
}

var toy = Process[toyConfig]{
	Name:    "toy",
	Summary: "A toy.",
	Default: func() toyConfig { return toyConfig{TaskShards: 4, LogLevel: "info", Pool: "default"} },
	Common: func(c *toyConfig) Common {
		return Common{NATS: &c.NATS, TaskShards: &c.TaskShards, LogLevel: &c.LogLevel, MetricsAddr: &c.Metrics}
	},
	Flags: func(fs *flag.FlagSet, c *toyConfig) { fs.StringVar(&c.Pool, "pool", c.Pool, "pool") },
}

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// flag > environment > file > default, for every setting alike.
func TestPrecedence(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "toy.yaml")
	if err := os.WriteFile(file, []byte("nats:\n  server: nats://file:4222\ntask_shards: 6\nlog_level: warn\npool: filepool\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := envOf(map[string]string{"NATS_URL": "nats://env:4222", "WARDEN_TASK_SHARDS": "7", "WARDEN_CONFIG": file})
	cfg, _, err := toy.resolve([]string{"--task-shards", "8"}, &bytes.Buffer{}, &bytes.Buffer{}, env)
	if err != nil {
		t.Fatal(err)
	}
	want := toyConfig{
		NATS:       natsconn.Options{URL: "nats://env:4222"}, // env over file
		TaskShards: 8,                                        // flag over env over file
		LogLevel:   "warn",                                   // file over default
		Pool:       "filepool",                               // file over default (process flag)
	}
	if cfg != want {
		t.Fatalf("resolved %+v, want %+v", cfg, want)
	}
	// Nothing set: the defaults.
	cfg, _, err = toy.resolve(nil, &bytes.Buffer{}, &bytes.Buffer{}, envOf(nil))
	if err != nil || cfg != toy.Default() {
		t.Fatalf("no flag, env or file: %+v, %v", cfg, err)
	}
}

func TestPrintConfigAndHelp(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := toy.run(context.Background(), []string{"--print-config", "--pool", "p9"}, &out, &out, envOf(nil))
	if err != nil || !strings.Contains(out.String(), "pool: p9") || !strings.Contains(out.String(), "task_shards: 4") {
		t.Fatalf("--print-config: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := toy.run(context.Background(), []string{"--help"}, &out, &out, envOf(nil)); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	if err := toy.run(context.Background(), []string{"extra"}, &out, &out, envOf(nil)); err == nil {
		t.Fatal("a positional argument was accepted")
	}
	if err := toy.run(context.Background(), nil, &out, &out, envOf(map[string]string{"WARDEN_TASK_SHARDS": "many"})); err == nil || !strings.Contains(err.Error(), "WARDEN_TASK_SHARDS") {
		t.Fatalf("a bad environment value must name the variable: %v", err)
	}
}

// Every process takes the same common flags, each with its variable, and
// prints the same precedence rule.
func TestEveryProcessHasTheCommonFlags(t *testing.T) {
	t.Parallel()
	helps := map[string]string{}
	help := func(name string, run func(out *bytes.Buffer) error) {
		var out bytes.Buffer
		if err := run(&out); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%s --help: %v", name, err)
		}
		helps[name] = out.String()
	}
	ctx := context.Background()
	help("scheduler", func(o *bytes.Buffer) error { return Scheduler.run(ctx, []string{"--help"}, o, o, envOf(nil)) })
	help("supervisor", func(o *bytes.Buffer) error { return Supervisor.run(ctx, []string{"--help"}, o, o, envOf(nil)) })
	help("agent", func(o *bytes.Buffer) error { return Agent.run(ctx, []string{"--help"}, o, o, envOf(nil)) })
	help("api", func(o *bytes.Buffer) error { return API.run(ctx, []string{"--help"}, o, o, envOf(nil)) })
	for name, h := range helps {
		want := []string{"-config", "-print-config", "-server", "-creds", "-log-level",
			"NATS_URL", "NATS_CREDS", "in order: its flag, its environment variable"}
		if name != "api" { // the api serves /metrics on --listen and has no tasks
			want = append(want, "-task-shards", "-metrics-addr", "WARDEN_TASK_SHARDS")
		}
		for _, f := range want {
			if !strings.Contains(h, f) {
				t.Errorf("%s --help lacks %q:\n%s", name, f, h)
			}
		}
	}
}

// resolveErr is p's resolve of args with no environment, for its error.
func resolveErr[C any](p Process[C]) func(args []string) error {
	return func(args []string) error {
		_, _, err := p.resolve(args, &bytes.Buffer{}, &bytes.Buffer{}, envOf(nil))
		return err
	}
}

// A misspelt log level is refused at start by every process, as any other
// bad setting: the logger would quietly log at info (the scheduler,
// supervisor and api never checked it; only the agent did).
func TestEveryProcessRefusesAnUnknownLogLevel(t *testing.T) {
	t.Parallel()
	for name, resolve := range map[string]func([]string) error{
		"scheduler": resolveErr(Scheduler), "supervisor": resolveErr(Supervisor),
		"api": resolveErr(API), "agent": resolveErr(Agent),
	} {
		var usage *UsageError
		if err := resolve([]string{"--log-level", "verbose"}); !errors.As(err, &usage) || !strings.Contains(err.Error(), "verbose") {
			t.Errorf("%s --log-level verbose: %v, want a usage error naming it", name, err)
		}
		if err := resolve([]string{"--log-level", "WARN"}); err != nil {
			t.Errorf("%s --log-level WARN: %v", name, err)
		}
	}
}

// --print-config output ends up in tickets and chat: an inline bearer
// token and a password in a NATS URL are printed redacted.
func TestPrintConfigHidesSecrets(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "api.yaml")
	body := "nats:\n  server: nats://u:hunter2@a:4222,nats://tok3n@b:4222\ntokens:\n  - name: ops\n    scope: admin\n    token: s3cr3t-s3cr3t-s3cr3t-s3cr3t\n"
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, printed, err := API.resolve([]string{"--config", file, "--print-config"}, &out, &bytes.Buffer{}, envOf(nil)); err != nil || !printed {
		t.Fatalf("--print-config: %v\n%s", err, out.String())
	}
	for _, secret := range []string{"hunter2", "tok3n", "s3cr3t"} {
		if strings.Contains(out.String(), secret) {
			t.Errorf("--print-config shows %q:\n%s", secret, out.String())
		}
	}
	if !strings.Contains(out.String(), "name: ops") || !strings.Contains(out.String(), "@a:4222") {
		t.Fatalf("--print-config lost what is not secret:\n%s", out.String())
	}
}

// --print-config showed the file's nats.ca and inbox_prefix while the
// connection uses NATS_CA and NATS_INBOX_PREFIX over them: the printed
// configuration was not the one in force.
func TestPrintConfigShowsTheNATSEnvironmentInForce(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "api.yaml")
	if err := os.WriteFile(file, []byte("nats:\n  ca: /etc/file-ca.pem\n  inbox_prefix: _INBOX.file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	env := envOf(map[string]string{"NATS_CA": "/run/env-ca.pem", "NATS_INBOX_PREFIX": "_INBOX.env"})
	if _, printed, err := API.resolve([]string{"--config", file, "--print-config"}, &out, &bytes.Buffer{}, env); err != nil || !printed {
		t.Fatalf("--print-config: %v\n%s", err, out.String())
	}
	for _, want := range []string{"/run/env-ca.pem", "_INBOX.env"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--print-config does not show %q, which the connection uses:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "file-ca") {
		t.Errorf("--print-config shows the file's ca, which NATS_CA replaces:\n%s", out.String())
	}
}

package dev

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

func TestPrefixWriterKeepsLinesWhole(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	out := &output{w: &b}
	a, c := newPrefixWriter(out, "a | "), newPrefixWriter(out, "c | ")
	_, _ = a.Write([]byte("one\ntw"))
	_, _ = c.Write([]byte("x\r\n"))
	_, _ = a.Write([]byte("o\nthree"))
	a.flush()
	want := "a | one\nc | x\na | two\na | three\n"
	if b.String() != want {
		t.Fatalf("got %q, want %q", b.String(), want)
	}
}

func TestPlan(t *testing.T) {
	t.Parallel()
	c, err := Config{Agents: 2, MetricsPort: 9300, BinDir: "/bin", ConfigDir: t.TempDir()}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	all := func(role, flag string) bool { return true }
	dep := deployment{TaskShards: 2, Partitions: 16}
	procs := plan(c, dep, "nats://127.0.0.1:4222", "/data", all)
	if len(procs) != 4 {
		t.Fatalf("%d processes", len(procs))
	}
	sched, a1, a2 := procs[0], procs[2], procs[3]
	if got := strings.Join(sched.Args, " "); got != "--server nats://127.0.0.1:4222 --task-shards 2 --partitions 16 --metrics-addr 127.0.0.1:9300" {
		t.Fatalf("scheduler args %q", got)
	}
	if got := strings.Join(a1.Args, " "); got != "--server nats://127.0.0.1:4222 --id agent-1 --pool default --capabilities linux,docker --task-shards 2 --config /data/config/agent-1.yaml" {
		t.Fatalf("agent-1 args %q", got)
	}
	if a2.MetricsURL != "http://127.0.0.1:9303/metrics" || a2.agentMetricsAddr != "127.0.0.1:9303" {
		t.Fatalf("agent-2 metrics %q", a2.MetricsURL)
	}
	none := func(role, flag string) bool { return false }
	if got := strings.Join(plan(c, dep, "u", "/d", none)[1].Args, " "); got != "--server u" {
		t.Fatalf("supervisor args without optional flags %q", got)
	}
}

func TestAgentConfigAddsToTheBase(t *testing.T) {
	t.Parallel()
	base := []byte("pool: default\nactions: [echo, deploy]\nshell:\n  allowed_commands: [make]\n  tail_bytes: 100\n")
	body, err := agentConfig(base, "127.0.0.1:9302")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Pool    string   `yaml:"pool"`
		Actions []string `yaml:"actions"`
		Shell   struct {
			AllowedCommands []string `yaml:"allowed_commands"`
			TailBytes       int      `yaml:"tail_bytes"`
		} `yaml:"shell"`
		Metrics string `yaml:"metrics_addr"`
		Drain   string `yaml:"drain_timeout"`
	}
	if err := yaml.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if got.Pool != "default" || strings.Join(got.Actions, ",") != "echo,deploy,sleep,shell,http" ||
		got.Shell.AllowedCommands[0] != "make" || !contains(got.Shell.AllowedCommands, "uname") ||
		got.Shell.TailBytes != 100 || got.Metrics != "127.0.0.1:9302" || got.Drain != devDrainTimeout {
		t.Fatalf("config %+v\n%s", got, body)
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func TestFlagProbeMatchesBothStyles(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		help, flag string
		want       bool
	}{
		{"  -config string\n  -metrics-addr string\n", "--metrics-addr", true},
		{"      --config FILE   config\n", "--config", true},
		{"  -config-dir string\n", "--config", false},
		{"  -server string\n", "--metrics-addr", false},
	} {
		if got := helpHasFlag(c.help, c.flag); got != c.want {
			t.Errorf("helpHasFlag(%q, %q) = %v", c.help, c.flag, got)
		}
	}
}

func TestDeploymentComesFromTheSchedulersFileUnderTheFlag(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "scheduler.yaml"), []byte("task_shards: 6\npartitions: 16\nworkers: 4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cfg  Config
		want deployment
	}{
		{Config{ConfigDir: dir}, deployment{TaskShards: 6, Partitions: 16}},
		{Config{ConfigDir: dir, TaskShards: 2}, deployment{TaskShards: 2, Partitions: 16}},
		{Config{ConfigDir: t.TempDir()}, deployment{TaskShards: 4, Partitions: 8}},
	} {
		got, err := deploymentOf(c.cfg)
		if err != nil || got != c.want {
			t.Errorf("deploymentOf(%+v) = %+v, %v; want %+v", c.cfg, got, err, c.want)
		}
	}
}

func TestChildrenDoNotInheritTheUsersNATSSettings(t *testing.T) {
	t.Setenv("NATS_CA", "/x/ca.pem")
	t.Setenv("NATS_CREDS", "/x/me.creds")
	t.Setenv("NATS_INBOX_PREFIX", "_INBOX.me")
	t.Setenv("NATS_URL", "tls://elsewhere:4222")
	env := strings.Join(childEnv("nats://127.0.0.1:1", false), "\n")
	for _, v := range []string{"NATS_CA=", "NATS_CREDS=", "NATS_INBOX_PREFIX=", "elsewhere"} {
		if strings.Contains(env, v) {
			t.Errorf("child environment has %s", v)
		}
	}
	if !strings.Contains(env, "NATS_URL=nats://127.0.0.1:1") {
		t.Error("child environment lacks the embedded server's URL")
	}
}

// The banner listed the API only under Metrics: it names the dashboard's
// URL when the API runs, and not otherwise.
func TestBannerNamesTheDashboard(t *testing.T) {
	t.Parallel()
	api := Process{Name: "api", Role: "api", MetricsURL: "http://127.0.0.1:8080/metrics"}
	for _, c := range []struct {
		addr  string
		procs []Process
		want  string
	}{
		{"127.0.0.1:8080", []Process{{Name: "scheduler", Role: "scheduler"}, api}, "Dashboard:                   http://127.0.0.1:8080/"},
		{":8080", []Process{api}, "Dashboard:                   http://127.0.0.1:8080/"},
		{"127.0.0.1:8080", []Process{{Name: "scheduler", Role: "scheduler"}}, ""},
	} {
		var b bytes.Buffer
		d := &devRun{cfg: Config{APIAddr: c.addr}, out: &output{w: &b}, width: 6}
		d.banner(Env{URL: "nats://127.0.0.1:4222", DataDir: "/tmp/x", Processes: c.procs})
		got := b.String()
		if c.want == "" {
			if strings.Contains(got, "Dashboard") {
				t.Errorf("no API, yet:\n%s", got)
			}
			continue
		}
		if !strings.Contains(got, "warden |   "+c.want+"\n") {
			t.Errorf("API on %s: banner lacks %q:\n%s", c.addr, c.want, got)
		}
	}
}

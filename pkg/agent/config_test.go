package agent_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/config"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/streams"
)

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c := agent.DefaultConfig()
	if c.ID == "" || c.Pool != "default" || c.MaxConcurrent != 4 || c.HeartbeatInterval.Std() != time.Second ||
		c.Lease.Std() != 10*time.Second || c.MaxDeliver != 5 || c.TaskShards != 4 || c.DrainTimeout.Std() != 30*time.Second ||
		c.Shell.TailBytes != 4096 || c.LogLevel != "info" || c.MetricsAddr != "" {
		t.Fatalf("defaults: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

func TestConfigValidateNamesFields(t *testing.T) {
	t.Parallel()
	c := agent.DefaultConfig()
	c.ID = "bad id"
	c.MaxConcurrent = -1
	c.Lease = 1
	c.MaxDeliver = -2
	c.Actions = []string{"echo", "echo"}
	c.LogLevel = "loud"
	err := c.Validate()
	for _, field := range []string{"id ", "max_concurrent", "lease", "max_deliver", "actions[1]", "log_level"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("error %v does not name %q", err, field)
		}
	}
}

// The shipped configs/agent.yaml decodes strictly, names every setting,
// and every value in it is the default: loaded alone (no defaults filled
// in), it equals DefaultConfig field for field.
func TestShippedConfigIsTheDefaults(t *testing.T) {
	t.Parallel()
	if diff := shippedAgentConfigDiff("../../configs/agent.yaml"); diff != "" {
		t.Fatalf("configs/agent.yaml: %s", diff)
	}
	// The comparison sees a change to any setting, not just a few.
	orig, err := os.ReadFile("../../configs/agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ from, to string }{
		{"\nactions: []\n", "\nactions: [shell]\n"},
		{"  allowed_commands: []\n", "  allowed_commands: [make]\n"},
		{"  allowed_env: []\n", "  allowed_env: [CI]\n"},
		{"  allowed_args: {}\n", "  allowed_args: {git: [[fetch]]}\n"},
		{"  allowed_hosts: []\n", "  allowed_hosts: [example.com]\n"},
		{"\nmax_result_bytes: 262144\n", "\nmax_result_bytes: 1000\n"},
		{"\nmetrics_addr: \"\"\n", "\nmetrics_addr: \":9102\"\n"},
		{"\ncapabilities: []\n", "\ncapabilities: [gpu]\n"},
		{"\nlabels: {}\n", "\nlabels: {zone: eu-1}\n"},
		{"\ncluster: \"\"\n", "\ncluster: c\n"},
		{"  server: \"\"\n", "  server: nats://elsewhere:4222\n"},
		{"\nfetch_wait: 30s\n", "\n"},    // a key missing
		{"\nmetrics_addr: \"\"\n", "\n"}, // a key missing whose default is zero
	} {
		if !bytes.Contains(orig, []byte(c.from)) {
			t.Errorf("configs/agent.yaml has no %q", c.from)
			continue
		}
		path := filepath.Join(t.TempDir(), "agent.yaml")
		if err := os.WriteFile(path, bytes.Replace(orig, []byte(c.from), []byte(c.to), 1), 0o600); err != nil {
			t.Fatal(err)
		}
		if diff := shippedAgentConfigDiff(path); diff == "" {
			t.Errorf("a copy with %q replaced by %q passes as the defaults", c.from, c.to)
		}
	}
}

// shippedAgentConfigDiff says how the config file at path differs from the
// defaults (config.ShippedDiff); the file leaves id to the host name.
func shippedAgentConfigDiff(path string) string {
	want := agent.DefaultConfig()
	want.ID = ""
	return config.ShippedDiff(path, &agent.Config{}, want)
}

// task_shards has the scheduler's bounds (streams.Options.Validate): an
// agent configured for a shard no scheduler has would wait for tasks that
// never come.
func TestConfigTaskShardsBounded(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		shards int
		ok     bool
	}{{-1, false}, {1, true}, {streams.MaxTaskShards, true}, {streams.MaxTaskShards + 1, false}, {1 << 20, false}} {
		cfg := agent.DefaultConfig()
		cfg.TaskShards = c.shards
		err := cfg.Validate()
		if c.ok && err != nil {
			t.Errorf("task_shards %d: %v", c.shards, err)
		}
		if !c.ok && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("task_shards must be between 1 and %d", streams.MaxTaskShards))) {
			t.Errorf("task_shards %d: got %v, want the bounds named", c.shards, err)
		}
	}
}

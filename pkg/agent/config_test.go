package agent_test

import (
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/config"
	"github.com/wardenhq/warden/pkg/agent"
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

// The shipped configs/agent.yaml decodes strictly and equals the defaults.
func TestShippedConfigIsTheDefaults(t *testing.T) {
	t.Parallel()
	var c agent.Config
	if err := config.Load("../../configs/agent.yaml", &c); err != nil {
		t.Fatal(err)
	}
	c.ID = agent.DefaultConfig().ID // the file leaves id to the host name
	got, want := c.WithDefaults(), agent.DefaultConfig()
	if !strings.EqualFold(got.LogLevel, want.LogLevel) || got.MaxConcurrent != want.MaxConcurrent ||
		got.Lease != want.Lease || got.HeartbeatInterval != want.HeartbeatInterval || got.DrainTimeout != want.DrainTimeout ||
		got.FetchWait != want.FetchWait || got.MaxDeliver != want.MaxDeliver || got.TaskShards != want.TaskShards ||
		got.Pool != want.Pool || got.Shell.TailBytes != want.Shell.TailBytes || got.HTTP.TailBytes != want.HTTP.TailBytes {
		t.Fatalf("configs/agent.yaml differs from the defaults:\n got %+v\nwant %+v", got, want)
	}
}

package health_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/config"
	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/pkg/protocol"
)

func TestConfigFile(t *testing.T) {
	t.Parallel()
	var got health.Config
	if err := config.Load("../../configs/health.yaml", &got); err != nil {
		t.Fatal(err)
	}
	if got != health.DefaultConfig() {
		t.Fatalf("configs/health.yaml = %+v\nwant the defaults %+v", got, health.DefaultConfig())
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
	partial := health.DefaultConfig()
	if err := config.Decode([]byte("weights: {error_rate: 0}\nthresholds: {unhealthy_level: failed}\n"), &partial); err != nil {
		t.Fatal(err)
	}
	if partial.Weights.ErrorRate != 0 || partial.Weights.HeartbeatRegularity != 0.3 || partial.Thresholds.UnhealthyLevel != health.Failed {
		t.Fatalf("partial file: %+v", partial)
	}
	if err := config.Decode([]byte("thresholds: {unhealthy_level: poorly}\n"), &partial); err == nil {
		t.Fatal("unknown level accepted")
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		edit func(*health.Config)
		want string
	}{
		{"interval", func(c *health.Config) { c.HeartbeatInterval = -1 }, "heartbeat_interval"},
		{"tolerance", func(c *health.Config) { c.HeartbeatTolerance = -1 }, "heartbeat_tolerance"},
		{"timeout", func(c *health.Config) { c.HeartbeatTimeout = protocol.Duration(time.Second) }, "heartbeat_timeout must be more than"},
		{"window", func(c *health.Config) { c.Window = protocol.Duration(time.Second) }, "window"},
		{"min tasks", func(c *health.Config) { c.MinTasks = -1 }, "min_tasks"},
		{"utilisation", func(c *health.Config) { c.UtilisationOK = 1 }, "utilisation_ok"},
		{"negative weight", func(c *health.Config) { c.Weights.ErrorRate = -0.1 }, "weights.error_rate"},
		{"levels order", func(c *health.Config) { c.Levels.Warning = 0.8 }, "levels.degraded must be above levels.warning"},
		{"healthy above 1", func(c *health.Config) { c.Levels.Healthy = 1.1 }, "levels.healthy"},
		{"counts", func(c *health.Config) { c.Thresholds.QueueDepth.Unhealthy = 50 }, "thresholds.queue_depth"},
		{"rates", func(c *health.Config) { c.Thresholds.FailureRate.Unhealthy = 1.5 }, "thresholds.failure_rate"},
		{"unhealthy level", func(c *health.Config) { c.Thresholds.UnhealthyLevel = health.Degraded }, "thresholds.unhealthy_level"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg := health.DefaultConfig()
			c.edit(&cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to contain %q", err, c.want)
			}
		})
	}
	weights := health.Config{Weights: health.Weights{ErrorRate: 1}}.WithDefaults()
	if weights.Weights != (health.Weights{ErrorRate: 1}) {
		t.Errorf("WithDefaults replaced a partly zero weights block: %+v", weights.Weights)
	}
}

func TestLevelText(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(health.Assessment{Level: health.Critical, Score: 0.4})
	if err != nil || !strings.Contains(string(b), `"level":"critical"`) {
		t.Fatalf("%s %v", b, err)
	}
	var a health.Assessment
	if err := json.Unmarshal(b, &a); err != nil || a.Level != health.Critical {
		t.Fatalf("%+v %v", a, err)
	}
	if !health.Failed.Worse(health.Critical) || health.Unknown.Worse(health.Healthy) || !health.Degraded.Worse(health.Unknown) {
		t.Fatal("Worse ordering")
	}
}

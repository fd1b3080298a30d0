package selection_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/wardenhq/warden/internal/config"
	"github.com/wardenhq/warden/internal/selection"
)

// TestConfigFile checks that testdata/selection.yaml, the section to embed
// in the scheduler's and supervisor's configuration, writes out exactly the
// defaults.
func TestConfigFile(t *testing.T) {
	t.Parallel()
	var got selection.Config
	if err := config.Load("testdata/selection.yaml", &got); err != nil {
		t.Fatal(err)
	}
	want := selection.DefaultConfig()
	want.Pools = map[string]selection.PoolConfig{}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("testdata/selection.yaml = %+v, want the defaults %+v", got, want)
	}
	partial := selection.DefaultConfig()
	if err := config.Decode([]byte("pools: {deploy: {strategy: standby}}\nhealth_factors: {degraded: 0.8}\n"), &partial); err != nil {
		t.Fatal(err)
	}
	if err := partial.Validate(); err != nil || partial.HealthFactors.Degraded != 0.8 || partial.HealthFactors.Healthy != 1 ||
		partial.Pools["deploy"].Strategy != selection.StrategyStandby {
		t.Fatalf("partial: %+v %v", partial, err)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		edit func(*selection.Config)
		want string
	}{
		{"strategy", func(c *selection.Config) { c.Strategy = "random" }, "strategy must be one of"},
		{"pool strategy", func(c *selection.Config) {
			c.Pools = map[string]selection.PoolConfig{"x": {Strategy: "fastest"}}
		}, "pools.x.strategy"},
		{"prior", func(c *selection.Config) { c.PriorSuccessRate = 2 }, "prior_success_rate"},
		{"weight", func(c *selection.Config) { c.PriorWeight = -1 }, "prior_weight"},
		{"factor range", func(c *selection.Config) { c.HealthFactors.Degraded = 1.5 }, "health_factors.degraded must be between"},
		{"factor order", func(c *selection.Config) { c.HealthFactors.Critical = 0.5 }, "health_factors.critical must not exceed health_factors.warning"},
		{"failed gets work", func(c *selection.Config) {
			c.HealthFactors = selection.HealthFactors{Healthy: 1, Degraded: 1, Warning: 1, Critical: 1, Failed: 1}
		}, "health_factors.failed must be 0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg := selection.DefaultConfig()
			c.edit(&cfg)
			if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want it to contain %q", err, c.want)
			}
			if _, err := selection.NewWithConfig(cfg); err == nil {
				t.Fatal("NewWithConfig accepted an invalid config")
			}
		})
	}
}

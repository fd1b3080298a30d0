package supervisor_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/wardenhq/warden/internal/config"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/protocol"
)

// configs/supervisor.yaml promises every setting with its default: loaded
// into a zero Config (no defaults under it), it equals DefaultConfig, so a
// key left out of the file or a value changed in it is seen.
func TestShippedConfigIsTheDefaults(t *testing.T) {
	t.Parallel()
	if diff := shippedSupervisorConfigDiff("../../configs/supervisor.yaml"); diff != "" {
		t.Fatalf("configs/supervisor.yaml differs from the defaults: %s", diff)
	}
	// A copy missing a key, or changing one, is told apart.
	orig, err := os.ReadFile("../../configs/supervisor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ from, to string }{
		{"\nlease_ttl: 5s\n", "\n"},            // missing, non-zero default
		{"\nself_healing: true\n", "\n"},       // missing: zero would turn it off
		{"\nmetrics_addr: \"\"\n", "\n"},       // missing, zero default
		{"\nreplicas: 1\n", "\nreplicas: 3\n"}, // changed
	} {
		if !bytes.Contains(orig, []byte(c.from)) {
			t.Errorf("configs/supervisor.yaml has no %q", c.from)
			continue
		}
		path := filepath.Join(t.TempDir(), "supervisor.yaml")
		if err := os.WriteFile(path, bytes.Replace(orig, []byte(c.from), []byte(c.to), 1), 0o600); err != nil {
			t.Fatal(err)
		}
		if diff := shippedSupervisorConfigDiff(path); diff == "" {
			t.Errorf("a copy with %q replaced by %q passes as the defaults", c.from, c.to)
		}
	}
}

// shippedSupervisorConfigDiff says how the file at path falls short of
// naming every setting with its default (config.ShippedDiff); the file
// leaves id random.
func shippedSupervisorConfigDiff(path string) string {
	want := supervisor.DefaultConfig()
	want.ID = ""
	return config.ShippedDiff(path, &supervisor.Config{}, want)
}

// configs/supervisor.yaml and docs/protocol.md say a negative
// anchor_interval turns anchors off; the decoder refused every negative
// duration, and 0 means the default, so anchors could not be turned off.
func TestNegativeAnchorIntervalTurnsAnchorsOff(t *testing.T) {
	t.Parallel()
	cfg := supervisor.DefaultConfig()
	if err := config.Decode([]byte("anchor_interval: -1s\n"), &cfg); err != nil {
		t.Fatalf("anchor_interval: -1s: %v", err)
	}
	if cfg = cfg.WithDefaults(); cfg.AnchorInterval.Std() >= 0 {
		t.Fatalf("anchor_interval decoded as %s, want negative (off)", cfg.AnchorInterval)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("anchor_interval -1s: %v", err)
	}
	// --print-config's output reads back as the same setting.
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	back := supervisor.DefaultConfig()
	if err := config.Decode(out, &back); err != nil || back.AnchorInterval != cfg.AnchorInterval {
		t.Fatalf("printed config read back: anchor_interval %s, %v", back.AnchorInterval, err)
	}
}

// Every count has the schedulers' bounds (a supervisor wrote partitions:
// 5000 into the deployment record, and then no scheduler could start; a
// negative one quietly became 8), and no loop interval may be so small
// that its ticker spins. Each refusal names its key.
func TestValidateBoundsEverySetting(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		yaml, key string
	}{
		{"partitions: 5000", "partitions"},
		{"partitions: -3", "partitions"},
		{"replicas: 7", "replicas"},
		{"replicas: -1", "replicas"},
		{"task_shards: 1000", "task_shards"},
		{"cycle_interval: 1ns", "cycle_interval"},
		{"recovery_retry: 1ns", "recovery_retry"},
		{"advance_timeout: 1ns", "advance_timeout"},
		{"anchor_interval: 1ns", "anchor_interval"},
	} {
		cfg := supervisor.DefaultConfig()
		if err := config.Decode([]byte(c.yaml+"\n"), &cfg); err != nil {
			t.Errorf("%s: %v", c.yaml, err)
			continue
		}
		if err := cfg.WithDefaults().Validate(); err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%s: Validate() = %v, want an error naming %s", c.yaml, err, c.key)
		}
	}
	cfg := supervisor.DefaultConfig()
	cfg.Partitions, cfg.Replicas, cfg.TaskShards = 1024, 5, 128
	cfg.CycleInterval, cfg.RecoveryRetry, cfg.AdvanceTimeout = protocol.Duration(100*time.Millisecond), protocol.Duration(100*time.Millisecond), protocol.Duration(100*time.Millisecond)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the largest counts and smallest intervals allowed: %v", err)
	}
}

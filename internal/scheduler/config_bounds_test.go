package scheduler_test

import (
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/wardenhq/warden/internal/config"
	"github.com/wardenhq/warden/internal/scheduler"
)

// configs/scheduler.yaml documents `retention: -1s` as keeping finished
// jobs forever; the decoder refused every negative duration, so it could
// not be set.
func TestRetentionForeverDecodes(t *testing.T) {
	t.Parallel()
	cfg := scheduler.DefaultConfig()
	if err := config.Decode([]byte("retention: -1s\n"), &cfg); err != nil {
		t.Fatalf("retention: -1s: %v", err)
	}
	if cfg = cfg.WithDefaults(); cfg.Retention.Std() >= 0 {
		t.Fatalf("retention decoded as %s, want negative (forever)", cfg.Retention)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("retention -1s: %v", err)
	}
	// --print-config's output reads back as the same setting.
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	back := scheduler.DefaultConfig()
	if err := config.Decode(out, &back); err != nil || back.Retention != cfg.Retention {
		t.Fatalf("printed config read back: retention %s, %v", back.Retention, err)
	}
}

// A negative max_steps quietly meant 1000, task_shards had no bound, and a
// loop interval of 1ns turned a ticker into a busy loop: each is refused,
// naming its key.
func TestValidateBoundsCountsAndIntervals(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		yaml, key string
	}{
		{"max_steps: -5", "max_steps"},
		{"task_shards: 1000", "task_shards"},
		{"task_shards: -2", "task_shards"},
		{"replicas: 6", "replicas"},
		{"partitions: 5000", "partitions"},
		{"write_timeout: 1ns", "write_timeout"},
		{"capacity_retry: 1ns", "capacity_retry"},
		{"wait_retry: 1ns", "wait_retry"},
	} {
		cfg := scheduler.DefaultConfig()
		if err := config.Decode([]byte(c.yaml+"\n"), &cfg); err != nil {
			t.Errorf("%s: %v", c.yaml, err)
			continue
		}
		if err := cfg.WithDefaults().Validate(); err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%s: Validate() = %v, want an error naming %s", c.yaml, err, c.key)
		}
	}
}

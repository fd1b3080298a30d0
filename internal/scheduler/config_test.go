package scheduler_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/config"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/protocol"
)

// configs/scheduler.yaml writes out every default: it must decode strictly
// and change nothing.
func TestShippedConfigIsTheDefaults(t *testing.T) {
	t.Parallel()
	cfg := scheduler.DefaultConfig()
	if err := config.Load("../../configs/scheduler.yaml", &cfg); err != nil {
		t.Fatal(err)
	}
	cfg = cfg.WithDefaults()
	if len(cfg.Selection.Pools) == 0 {
		cfg.Selection.Pools = nil // "pools: {}" decodes to an empty map
	}
	if !reflect.DeepEqual(cfg, scheduler.DefaultConfig()) {
		t.Fatalf("configs/scheduler.yaml differs from the defaults:\n%+v\n%+v", cfg, scheduler.DefaultConfig())
	}
}

// A retention below the server's smallest TTL would make every job's
// terminal write fail; a negative one keeps records forever.
func TestRetentionBounds(t *testing.T) {
	for _, c := range []struct {
		retention time.Duration
		ok        bool
	}{{500 * time.Millisecond, false}, {time.Second, true}, {-time.Second, true}, {0, true}} {
		cfg := scheduler.DefaultConfig()
		cfg.Retention = protocol.SignedDuration(c.retention)
		if err := cfg.WithDefaults().Validate(); (err == nil) != c.ok {
			t.Errorf("retention %s: Validate() = %v", c.retention, err)
		}
	}
}

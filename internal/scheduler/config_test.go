package scheduler_test

import (
	"reflect"
	"testing"

	"github.com/wardenhq/warden/internal/config"
	"github.com/wardenhq/warden/internal/scheduler"
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

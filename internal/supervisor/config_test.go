package supervisor_test

import (
	"reflect"
	"testing"

	"github.com/wardenhq/warden/internal/config"
	"github.com/wardenhq/warden/internal/supervisor"
)

func TestShippedConfigIsTheDefaults(t *testing.T) {
	t.Parallel()
	want := supervisor.DefaultConfig()
	cfg := want
	cfg.ID = ""
	if err := config.Load("../../configs/supervisor.yaml", &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.ID = want.ID // random by default
	if cfg = cfg.WithDefaults(); !reflect.DeepEqual(cfg, want) {
		t.Fatalf("configs/supervisor.yaml differs from the defaults:\n%+v\n%+v", cfg, want)
	}
}

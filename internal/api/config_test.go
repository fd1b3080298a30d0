package api_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/wardenhq/warden/internal/api"
	"github.com/wardenhq/warden/internal/config"
)

// TestConfigFile: configs/api.yaml writes out exactly the defaults.
func TestConfigFile(t *testing.T) {
	t.Parallel()
	cfg := api.Config{}
	if err := config.Load("../../configs/api.yaml", &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Tokens, cfg.AnonymousHosts = nil, nil // the file's empty lists
	if got, want := cfg.WithDefaults(), api.DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Fatalf("configs/api.yaml:\n%+v\ndefaults:\n%+v", got, want)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	cases := map[string]func(*api.Config){
		"anonymous_scope": func(c *api.Config) { c.AnonymousScope = "root" },
		"tokens[0].scope": func(c *api.Config) { c.Tokens = []api.Token{{Scope: "write", Token: "0123456789abcdef"}} },
		"exactly one":     func(c *api.Config) { c.Tokens = []api.Token{{Scope: "read"}} },
		"max_body_bytes":  func(c *api.Config) { c.MaxBodyBytes = 10 },
	}
	for want, edit := range cases {
		c := api.DefaultConfig()
		edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
}

package api_test

import (
	"os"
	"path/filepath"
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
		`tokens[1].name "ops" is also tokens[0].name`: func(c *api.Config) {
			c.Tokens = []api.Token{{Name: "ops", Scope: "read", Token: "0123456789abcdef"}, {Name: "ops", Scope: "admin", Token: "fedcba9876543210"}}
		},
	}
	for want, edit := range cases {
		c := api.DefaultConfig()
		edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
}

// The keyring was keyed by the secret's digest, each entry overwriting
// the one before: one secret listed as read and then as admin was admin,
// silently. A secret listed twice is a config error now, naming both.
func TestRepeatedTokenSecretIsRefused(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := api.Config{Tokens: []api.Token{
		{Name: "grafana", Scope: api.ScopeRead, Token: "0123456789abcdef"},
		{Name: "oncall", Scope: api.ScopeAdmin, TokenFile: file},
	}}
	_, err := api.New(cfg, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "tokens[1] (oncall) has the same secret as tokens[0] (grafana)") {
		t.Fatalf("one secret as read and as admin: %v, want it refused", err)
	}
}

package api

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/wardenhq/warden/internal/natsconn"
)

// Scope is what a token may do.
type Scope string

// Scopes. Admin includes read.
const (
	// ScopeNone: no access (an anonymous request when AnonymousScope is
	// empty).
	ScopeNone Scope = ""
	// ScopeRead reads everything.
	ScopeRead Scope = "read"
	// ScopeAdmin also submits, cancels, retries, drains, fails over and
	// purges, and defines, changes, deletes, rebalances and fails over
	// clusters.
	ScopeAdmin Scope = "admin"
)

// allows reports whether a holder of s may use a route needing need.
func (s Scope) allows(need Scope) bool {
	switch need {
	case ScopeNone:
		return true
	case ScopeRead:
		return s == ScopeRead || s == ScopeAdmin
	default:
		return s == ScopeAdmin
	}
}

// Token is one bearer token from the config.
type Token struct {
	// Name identifies the token in logs (never the token itself); two
	// tokens may not have the same name.
	Name string `yaml:"name"`
	// Scope is read or admin.
	Scope Scope `yaml:"scope"`
	// Token is the secret; prefer TokenFile.
	Token string `yaml:"token"`
	// TokenFile holds the secret (surrounding whitespace is ignored).
	// Two tokens may not have the same secret: which scope it had would
	// depend on their order.
	TokenFile string `yaml:"token_file"`
}

// Redacted is c with inline token secrets replaced, for --print-config
// (which redacts the NATS URL itself, as for every process).
func (c Config) Redacted() Config {
	c.Tokens = append([]Token(nil), c.Tokens...)
	for i := range c.Tokens {
		if c.Tokens[i].Token != "" {
			c.Tokens[i].Token = "(redacted)"
		}
	}
	return c
}

// Config configures `warden api`. configs/api.yaml writes out every default.
type Config struct {
	NATS natsconn.Options `yaml:"nats"`
	// Listen is the HTTP address. Defaults to "127.0.0.1:8080".
	Listen string `yaml:"listen"`
	// MaxBodyBytes bounds a request body. Defaults to 1 MiB (the NATS
	// payload limit a submission must fit in anyway).
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// RequestTimeout bounds one request's work (not the event stream).
	// Defaults to 30s.
	RequestTimeout time.Duration `yaml:"request_timeout"`
	// Tokens are the accepted bearer tokens.
	Tokens []Token `yaml:"tokens"`
	// AnonymousScope is what a request without a token may do: "" (nothing:
	// 401), read or admin. `warden dev` sets admin on its loopback API.
	AnonymousScope Scope `yaml:"anonymous_scope"`
	// AnonymousHosts are host names (besides IP addresses and localhost)
	// under which requests without a token are served: a DNS name someone
	// else controls could otherwise be rebound to this address and a
	// browser's page use anonymous access. Defaults to none.
	AnonymousHosts []string `yaml:"anonymous_hosts"`
	// Dashboard serves the web dashboard at /. Defaults to true.
	Dashboard *bool `yaml:"dashboard"`
	// Micro registers the NATS micro service warden-api. Defaults to true.
	Micro *bool `yaml:"micro"`
	// LogLevel is debug, info, warn or error. Defaults to info.
	LogLevel string `yaml:"log_level"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{}.WithDefaults() }

// WithDefaults fills every unset field.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 1 << 20
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 30 * time.Second
	}
	if c.Dashboard == nil {
		t := true
		c.Dashboard = &t
	}
	if c.Micro == nil {
		t := true
		c.Micro = &t
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	return c
}

// Validate checks the config; errors name the field and the rule.
func (c Config) Validate() error {
	var errs []error
	switch c.AnonymousScope {
	case ScopeNone, ScopeRead, ScopeAdmin:
	default:
		errs = append(errs, fmt.Errorf("anonymous_scope must be empty, read or admin, got %q", c.AnonymousScope))
	}
	if c.MaxBodyBytes < 1024 {
		errs = append(errs, fmt.Errorf("max_body_bytes must be at least 1024, got %d", c.MaxBodyBytes))
	}
	named := map[string]int{}
	for i, t := range c.Tokens {
		if j, ok := named[t.Name]; ok && t.Name != "" {
			errs = append(errs, fmt.Errorf("tokens[%d].name %q is also tokens[%d].name: each token needs a name of its own", i, t.Name, j))
		} else {
			named[t.Name] = i
		}
		if t.Scope != ScopeRead && t.Scope != ScopeAdmin {
			errs = append(errs, fmt.Errorf("tokens[%d].scope must be read or admin, got %q", i, t.Scope))
		}
		if (t.Token == "") == (t.TokenFile == "") {
			errs = append(errs, fmt.Errorf("tokens[%d] needs exactly one of token and token_file", i))
		}
	}
	return errors.Join(errs...)
}

// keyring maps token digests to their scope and name.
type keyring map[[sha256.Size]byte]Token

// loadTokens reads the secrets. A secret listed twice is refused, not
// given the scope of its last entry: listed as read and as admin, it
// was admin.
func loadTokens(ts []Token) (keyring, error) {
	k := keyring{}
	at := map[[sha256.Size]byte]int{}
	for i, t := range ts {
		secret := t.Token
		if t.TokenFile != "" {
			b, err := os.ReadFile(t.TokenFile)
			if err != nil {
				return nil, fmt.Errorf("tokens[%d].token_file: %w", i, err)
			}
			secret = strings.TrimSpace(string(b))
		}
		if len(secret) < 16 {
			return nil, fmt.Errorf("tokens[%d] (%s): a token must be at least 16 characters", i, t.Name)
		}
		d := sha256.Sum256([]byte(secret))
		if j, ok := at[d]; ok {
			return nil, fmt.Errorf("tokens[%d] (%s) has the same secret as tokens[%d] (%s): each token needs a secret of its own", i, t.Name, j, ts[j].Name)
		}
		at[d] = i
		t.Token, t.TokenFile = "", ""
		k[d] = t
	}
	return k, nil
}

package retry

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Defaults of a Policy.
const (
	DefaultMaxRetries  = 3
	DefaultBaseBackoff = time.Second
	DefaultMultiplier  = 2.0
	DefaultMaxBackoff  = 300 * time.Second
	DefaultJitter      = 0.2
)

// MaxMaxRetries bounds max_retries (the step spec enforces the same bound).
const MaxMaxRetries = 100

// ErrInvalidConfig is wrapped by every Validate error of this package.
var ErrInvalidConfig = errors.New("invalid retry config")

// Policy says how often and how soon a step is retried. Decode it onto
// DefaultPolicy() so that omitted fields keep their defaults: 0 is a
// meaningful max_retries (never retry) and jitter (no jitter).
type Policy struct {
	// MaxRetries bounds re-executions after a retriable failure; 0 never
	// retries. Defaults to 3.
	MaxRetries int `yaml:"max_retries" json:"max_retries"`
	// BaseBackoff is the delay before the first retry. Defaults to 1s.
	BaseBackoff protocol.Duration `yaml:"base_backoff" json:"base_backoff"`
	// Multiplier grows the delay of each further retry; 1 keeps it
	// constant. Defaults to 2.
	Multiplier float64 `yaml:"multiplier" json:"multiplier"`
	// MaxBackoff caps the nominal delay (before jitter). Defaults to 300s.
	MaxBackoff protocol.Duration `yaml:"max_backoff" json:"max_backoff"`
	// Jitter scales every delay by a random factor in [1−jitter, 1+jitter],
	// so retries of many steps failed together do not return together.
	// 0..1; defaults to 0.2.
	Jitter float64 `yaml:"jitter" json:"jitter"`
}

// DefaultPolicy returns the policy with every default: 3 retries, 1s, ×2,
// at most 300s, ±20%.
func DefaultPolicy() Policy {
	return Policy{
		MaxRetries:  DefaultMaxRetries,
		BaseBackoff: protocol.Duration(DefaultBaseBackoff),
		Multiplier:  DefaultMultiplier,
		MaxBackoff:  protocol.Duration(DefaultMaxBackoff),
		Jitter:      DefaultJitter,
	}
}

// WithDefaults fills the fields whose zero value is not meaningful:
// base_backoff, multiplier and max_backoff. MaxRetries and Jitter are kept
// as they are, 0 included.
func (p Policy) WithDefaults() Policy {
	if p.BaseBackoff == 0 {
		p.BaseBackoff = protocol.Duration(DefaultBaseBackoff)
	}
	if p.Multiplier == 0 {
		p.Multiplier = DefaultMultiplier
	}
	if p.MaxBackoff == 0 {
		p.MaxBackoff = protocol.Duration(DefaultMaxBackoff)
	}
	return p
}

// Validate reports the first field that breaks a rule, named as in YAML.
func (p Policy) Validate() error { return p.validate("") }

func (p Policy) validate(prefix string) error {
	switch {
	case p.MaxRetries < 0 || p.MaxRetries > MaxMaxRetries:
		return invalid("%smax_retries must be between 0 and %d, got %d", prefix, MaxMaxRetries, p.MaxRetries)
	case p.BaseBackoff <= 0:
		return invalid("%sbase_backoff must be positive, got %s", prefix, p.BaseBackoff)
	case math.IsNaN(p.Multiplier) || p.Multiplier < 1 || p.Multiplier > 100:
		return invalid("%smultiplier must be between 1 and 100, got %g", prefix, p.Multiplier)
	case p.MaxBackoff < p.BaseBackoff:
		return invalid("%smax_backoff must be at least base_backoff (%s), got %s", prefix, p.BaseBackoff, p.MaxBackoff)
	case math.IsNaN(p.Jitter) || p.Jitter < 0 || p.Jitter > 1:
		return invalid("%sjitter must be between 0 and 1, got %g", prefix, p.Jitter)
	}
	return nil
}

// Nominal is the delay of retry n before jitter: min(base × multiplier^n,
// max). n is the number of retries already made (0 for the first retry);
// a negative n counts as 0.
func (p Policy) Nominal(n int) time.Duration {
	n = max(n, 0)
	d := float64(p.BaseBackoff) * math.Pow(p.Multiplier, float64(n))
	if math.IsNaN(d) || d >= float64(p.MaxBackoff) {
		return p.MaxBackoff.Std()
	}
	return time.Duration(d)
}

// Delay is the delay of retry n (0 for the first retry): Nominal(n) scaled
// by 1 − jitter + 2 × jitter × rnd(). rnd returns a value in [0, 1), as
// math/rand/v2.Float64 does (used when rnd is nil); values outside are
// clamped, and NaN counts as 0.5 (no jitter). The result lies in
// [Nominal×(1−jitter), Nominal×(1+jitter)]: the jitter may take it up to
// max_backoff × (1 + jitter). It is never negative, even for a policy that
// fails Validate.
func (p Policy) Delay(n int, rnd func() float64) time.Duration {
	if rnd == nil {
		rnd = rand.Float64
	}
	u := rnd()
	if math.IsNaN(u) {
		// min and max pass NaN through, and time.Duration(NaN) is the most
		// negative Duration: a retry due before it failed.
		u = 0.5
	}
	u = min(max(u, 0), 1)
	factor := 1 - p.Jitter + 2*p.Jitter*u
	return durationOf(float64(p.Nominal(n)) * factor)
}

// durationOf converts nanoseconds to a Duration in [0, math.MaxInt64]: a
// float conversion out of int64's range (or of NaN) is
// implementation-defined in Go, and on amd64 yields the most negative
// Duration. Only a policy that fails Validate (jitter outside 0..1 or NaN,
// a negative base_backoff, a max_backoff near the int64 limit) gets here
// with such a value.
func durationOf(ns float64) time.Duration {
	switch {
	case math.IsNaN(ns) || ns <= 0:
		return 0
	case ns >= math.MaxInt64:
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// Next says whether a step that failed with d after retriesDone retries is
// tried again, and after how long: only retriable failures are, while
// retriesDone < max_retries; the delay is Delay(retriesDone), or the delay
// the agent asked for (d.After) when that is longer.
func (p Policy) Next(retriesDone int, d Decision, rnd func() float64) (time.Duration, bool) {
	if !d.Retriable || retriesDone >= p.MaxRetries {
		return 0, false
	}
	return max(p.Delay(retriesDone, rnd), d.After), true
}

// Override changes some fields of a policy: for one action in the
// configuration, or for one step in its spec. A nil field inherits.
type Override struct {
	MaxRetries  *int               `yaml:"max_retries,omitempty" json:"max_retries,omitempty"`
	BaseBackoff *protocol.Duration `yaml:"base_backoff,omitempty" json:"base_backoff,omitempty"`
	Multiplier  *float64           `yaml:"multiplier,omitempty" json:"multiplier,omitempty"`
	MaxBackoff  *protocol.Duration `yaml:"max_backoff,omitempty" json:"max_backoff,omitempty"`
	Jitter      *float64           `yaml:"jitter,omitempty" json:"jitter,omitempty"`
}

// Apply returns p with the fields o sets replaced.
func (o Override) Apply(p Policy) Policy {
	if o.MaxRetries != nil {
		p.MaxRetries = *o.MaxRetries
	}
	if o.BaseBackoff != nil {
		p.BaseBackoff = *o.BaseBackoff
	}
	if o.Multiplier != nil {
		p.Multiplier = *o.Multiplier
	}
	if o.MaxBackoff != nil {
		p.MaxBackoff = *o.MaxBackoff
	}
	if o.Jitter != nil {
		p.Jitter = *o.Jitter
	}
	return p
}

// Policies are the retry policy of every action: Default, changed per action
// by ByAction.
type Policies struct {
	// Default applies to every action without an entry in ByAction.
	Default Policy `yaml:"default" json:"default"`
	// ByAction overrides fields of Default for one action, by action name.
	// Defaults to none.
	ByAction map[string]Override `yaml:"actions" json:"actions,omitempty"`
}

// DefaultPolicies returns DefaultPolicy for every action.
func DefaultPolicies() Policies { return Policies{Default: DefaultPolicy()} }

// WithDefaults fills Default's zero fields (see Policy.WithDefaults).
func (ps Policies) WithDefaults() Policies {
	ps.Default = ps.Default.WithDefaults()
	return ps
}

// Validate checks Default and every action's resulting policy.
func (ps Policies) Validate() error {
	if err := ps.Default.validate("default."); err != nil {
		return err
	}
	names := make([]string, 0, len(ps.ByAction))
	for name := range ps.ByAction {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if name == "" {
			return invalid("actions: an entry has an empty action name")
		}
		if err := ps.ByAction[name].Apply(ps.Default).validate("actions." + name + "."); err != nil {
			return err
		}
	}
	return nil
}

// Resolve returns the policy of a step running action: Default, then the
// action's override, then the step's own (nil: none). The result may be
// invalid when step carries bad values; check it with Validate where the
// step is accepted.
func (ps Policies) Resolve(action string, step *Override) Policy {
	p := ps.Default
	if o, ok := ps.ByAction[action]; ok {
		p = o.Apply(p)
	}
	if step != nil {
		p = step.Apply(p)
	}
	return p
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

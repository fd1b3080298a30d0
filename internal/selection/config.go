package selection

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Strategy names how a pool's agent is chosen among the eligible ones.
type Strategy string

// Strategies.
const (
	// StrategyScore picks the highest Score: success rate over load, scaled
	// by health. The default.
	StrategyScore Strategy = "score"
	// StrategyLeastLoaded picks the lowest (in flight + assigned) /
	// max_concurrent.
	StrategyLeastLoaded Strategy = "least_loaded"
	// StrategyRoundRobin takes the agents in turn, by id, each kind of step
	// (action and required capabilities) on its own turn.
	StrategyRoundRobin Strategy = "round_robin"
	// StrategyAffinity prefers agents whose labels hold every wanted label
	// (the pool's affinity, then the request's labels); score among them,
	// and among all when none matches or all matching ones are full.
	StrategyAffinity Strategy = "affinity"
	// StrategyStandby gives everything to the available agent with the
	// lowest id; the others get work only while it is unavailable (gone,
	// draining, excluded by health). When it is merely full, steps wait.
	StrategyStandby Strategy = "standby"
)

var strategies = []Strategy{StrategyScore, StrategyLeastLoaded, StrategyRoundRobin, StrategyAffinity, StrategyStandby}

// ErrInvalidConfig is wrapped by every Validate error.
var ErrInvalidConfig = errors.New("invalid selection config")

// Config configures a Selector. Decode it onto DefaultConfig() so that
// omitted fields keep their defaults (0 is a meaningful factor or weight).
type Config struct {
	// Strategy of every pool without its own. Defaults to score.
	Strategy Strategy `yaml:"strategy" json:"strategy"`
	// Pools sets a strategy (and affinity labels) per pool name. Defaults
	// to none.
	Pools map[string]PoolConfig `yaml:"pools" json:"pools,omitempty"`
	// PriorSuccessRate and PriorWeight smooth the success rate read from an
	// agent's lifetime counters: (succeeded + prior × weight) / (succeeded +
	// failed + weight), so a new agent starts at the prior and a few
	// failures do not sink it. Used only when the agent's health
	// assessment carries no windowed success rate. Default to 1 and 10.
	PriorSuccessRate float64 `yaml:"prior_success_rate" json:"prior_success_rate"`
	PriorWeight      float64 `yaml:"prior_weight" json:"prior_weight"`
	// HealthFactors multiply an agent's score by its assessed health level;
	// 0 makes the level ineligible. An agent without assessment counts as
	// healthy.
	HealthFactors HealthFactors `yaml:"health_factors" json:"health_factors"`
	// StartGrace is how long after it starts a scheduler takes an action
	// that no present agent of the pool offers for one whose agents are
	// not back yet (the step waits) rather than unknown (the step fails):
	// it knows of agents that left only from its start, so an agent
	// offline across its restart, or restarting with it, failed its steps
	// for good. Defaults to 30s; negative: none.
	StartGrace protocol.Duration `yaml:"start_grace" json:"start_grace"`
}

// PoolConfig is one pool's selection.
type PoolConfig struct {
	// Strategy of the pool. Empty: Config.Strategy.
	Strategy Strategy `yaml:"strategy" json:"strategy,omitempty"`
	// Affinity are the labels the affinity strategy prefers in this pool;
	// a request's own labels override them key by key.
	Affinity map[string]string `yaml:"affinity" json:"affinity,omitempty"`
}

// HealthFactors scale the score by health level; 0 excludes the level.
type HealthFactors struct {
	Healthy  float64 `yaml:"healthy" json:"healthy"`
	Degraded float64 `yaml:"degraded" json:"degraded"`
	Warning  float64 `yaml:"warning" json:"warning"`
	Critical float64 `yaml:"critical" json:"critical"`
	Failed   float64 `yaml:"failed" json:"failed"`
}

// DefaultHealthFactors: healthy 1, degraded 0.5, warning 0.25; critical
// (being drained) and failed (being failed over) get no new work.
func DefaultHealthFactors() HealthFactors {
	return HealthFactors{Healthy: 1, Degraded: 0.5, Warning: 0.25, Critical: 0, Failed: 0}
}

// Of returns the factor of a level; Unknown counts as healthy.
func (f HealthFactors) Of(l health.Level) float64 {
	switch l {
	case health.Degraded:
		return f.Degraded
	case health.Warning:
		return f.Warning
	case health.Critical:
		return f.Critical
	case health.Failed:
		return f.Failed
	}
	return f.Healthy
}

// DefaultConfig returns the configuration with every default filled in.
func DefaultConfig() Config { return Config{}.WithDefaults() }

// WithDefaults fills the zero fields: the strategy; the prior when both its
// fields are zero; the health factors when all are zero; the start grace.
func (c Config) WithDefaults() Config {
	if c.Strategy == "" {
		c.Strategy = StrategyScore
	}
	if c.PriorSuccessRate == 0 && c.PriorWeight == 0 {
		c.PriorSuccessRate, c.PriorWeight = 1, 10
	}
	if c.HealthFactors == (HealthFactors{}) {
		c.HealthFactors = DefaultHealthFactors()
	}
	if c.StartGrace == 0 {
		c.StartGrace = protocol.Duration(30 * time.Second)
	}
	return c
}

// Validate reports the first field that breaks a rule, named as in YAML.
func (c Config) Validate() error {
	if !known(c.Strategy) {
		return invalid("strategy must be one of %v, got %q", strategies, c.Strategy)
	}
	pools := make([]string, 0, len(c.Pools))
	for p := range c.Pools {
		pools = append(pools, p)
	}
	sort.Strings(pools)
	for _, p := range pools {
		if s := c.Pools[p].Strategy; s != "" && !known(s) {
			return invalid("pools.%s.strategy must be one of %v, got %q", p, strategies, s)
		}
	}
	switch {
	case bad(c.PriorSuccessRate) || c.PriorSuccessRate < 0 || c.PriorSuccessRate > 1:
		return invalid("prior_success_rate must be between 0 and 1, got %g", c.PriorSuccessRate)
	case bad(c.PriorWeight) || c.PriorWeight < 0:
		return invalid("prior_weight must not be negative, got %g", c.PriorWeight)
	}
	f := c.HealthFactors
	levels := []struct {
		name string
		v    float64
	}{{"healthy", f.Healthy}, {"degraded", f.Degraded}, {"warning", f.Warning}, {"critical", f.Critical}, {"failed", f.Failed}}
	for i, l := range levels {
		if bad(l.v) || l.v < 0 || l.v > 1 {
			return invalid("health_factors.%s must be between 0 and 1, got %g", l.name, l.v)
		}
		if i > 0 && l.v > levels[i-1].v {
			return invalid("health_factors.%s must not exceed health_factors.%s (%g), got %g", l.name, levels[i-1].name, levels[i-1].v, l.v)
		}
	}
	switch {
	case f.Healthy <= 0:
		return invalid("health_factors.healthy must be positive, got %g", f.Healthy)
	case f.Failed != 0:
		return invalid("health_factors.failed must be 0: failed agents never get work, got %g", f.Failed)
	}
	return nil
}

// strategyOf returns the strategy of a pool.
func (c Config) strategyOf(pool string) Strategy {
	if p, ok := c.Pools[pool]; ok && p.Strategy != "" {
		return p.Strategy
	}
	return c.Strategy
}

func known(s Strategy) bool {
	for _, k := range strategies {
		if s == k {
			return true
		}
	}
	return false
}

func bad(f float64) bool { return math.IsNaN(f) || math.IsInf(f, 0) }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

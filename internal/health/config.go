package health

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// ErrInvalidConfig is wrapped by every Validate error.
var ErrInvalidConfig = errors.New("invalid health config")

// Config is configs/health.yaml. Decode it onto DefaultConfig() so that
// omitted fields keep their defaults; WithDefaults fills the zero fields
// whose zero value is not meaningful.
type Config struct {
	// HeartbeatInterval is the interval agents heartbeat at, unless an
	// Observation says otherwise. Defaults to 1s (the agent's default).
	HeartbeatInterval protocol.Duration `yaml:"heartbeat_interval" json:"heartbeat_interval"`
	// HeartbeatTolerance is how late a heartbeat may be, as a fraction of
	// the interval, before regularity suffers. Defaults to 0.5.
	HeartbeatTolerance float64 `yaml:"heartbeat_tolerance" json:"heartbeat_tolerance"`
	// HeartbeatTimeout: an agent silent this long is failed. Defaults to 5s.
	HeartbeatTimeout protocol.Duration `yaml:"heartbeat_timeout" json:"heartbeat_timeout"`
	// Window is how far back the Tracker looks for rates and gaps. Defaults
	// to 5m.
	Window protocol.Duration `yaml:"window" json:"window"`
	// MinTasks is how many tasks must have finished in the window before
	// rates (completion, error, failure rate) count. Defaults to 5.
	MinTasks int `yaml:"min_tasks" json:"min_tasks"`
	// UtilisationOK is the resource utilisation (0..1) up to which the
	// utilisation component is perfect. Defaults to 0.8.
	UtilisationOK float64 `yaml:"utilisation_ok" json:"utilisation_ok"`
	// Weights of the score's components.
	Weights Weights `yaml:"weights" json:"weights"`
	// Levels are the least scores of each level.
	Levels LevelThresholds `yaml:"levels" json:"levels"`
	// Thresholds cap the level whatever the score.
	Thresholds Thresholds `yaml:"thresholds" json:"thresholds"`
}

// Weights are the relative weights of the score's components; they need not
// sum to 1 (the score divides by the sum of the known components' weights).
// 0 leaves a component out.
type Weights struct {
	SelfReported        float64 `yaml:"self_reported" json:"self_reported"`
	HeartbeatRegularity float64 `yaml:"heartbeat_regularity" json:"heartbeat_regularity"`
	TaskCompletion      float64 `yaml:"task_completion" json:"task_completion"`
	ResourceUtilisation float64 `yaml:"resource_utilisation" json:"resource_utilisation"`
	ErrorRate           float64 `yaml:"error_rate" json:"error_rate"`
}

// LevelThresholds are the least score of each level; below Critical is
// failed.
type LevelThresholds struct {
	Healthy  float64 `yaml:"healthy" json:"healthy"`
	Degraded float64 `yaml:"degraded" json:"degraded"`
	Warning  float64 `yaml:"warning" json:"warning"`
	Critical float64 `yaml:"critical" json:"critical"`
}

// Thresholds are hard limits: reaching Degraded caps the level at degraded,
// reaching Unhealthy caps it at UnhealthyLevel.
type Thresholds struct {
	ConsecutiveFailures CountLimits `yaml:"consecutive_failures" json:"consecutive_failures"`
	QueueDepth          CountLimits `yaml:"queue_depth" json:"queue_depth"`
	FailureRate         RateLimits  `yaml:"failure_rate" json:"failure_rate"`
	// UnhealthyLevel is the level of an agent past an unhealthy limit:
	// warning, critical or failed. Defaults to critical (drain it).
	UnhealthyLevel Level `yaml:"unhealthy_level" json:"unhealthy_level"`
}

// CountLimits are a degraded and an unhealthy limit on a count.
type CountLimits struct {
	Degraded  int `yaml:"degraded" json:"degraded"`
	Unhealthy int `yaml:"unhealthy" json:"unhealthy"`
}

// RateLimits are a degraded and an unhealthy limit on a rate (0..1).
type RateLimits struct {
	Degraded  float64 `yaml:"degraded" json:"degraded"`
	Unhealthy float64 `yaml:"unhealthy" json:"unhealthy"`
}

// DefaultWeights are 0.2, 0.3, 0.25, 0.15, 0.1.
func DefaultWeights() Weights {
	return Weights{SelfReported: 0.2, HeartbeatRegularity: 0.3, TaskCompletion: 0.25, ResourceUtilisation: 0.15, ErrorRate: 0.1}
}

// DefaultConfig returns the configuration with every default filled in.
func DefaultConfig() Config { return Config{}.WithDefaults() }

// WithDefaults fills every zero field with its default; the weights only
// when all five are zero (a single 0 weight is meaningful).
func (c Config) WithDefaults() Config {
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = protocol.Duration(time.Second)
	}
	if c.HeartbeatTolerance == 0 {
		c.HeartbeatTolerance = 0.5
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = protocol.Duration(5 * time.Second)
	}
	if c.Window == 0 {
		c.Window = protocol.Duration(5 * time.Minute)
	}
	if c.MinTasks == 0 {
		c.MinTasks = 5
	}
	if c.UtilisationOK == 0 {
		c.UtilisationOK = 0.8
	}
	if c.Weights == (Weights{}) {
		c.Weights = DefaultWeights()
	}
	if c.Levels == (LevelThresholds{}) {
		c.Levels = LevelThresholds{Healthy: 0.9, Degraded: 0.7, Warning: 0.5, Critical: 0.3}
	}
	t := &c.Thresholds
	if t.ConsecutiveFailures == (CountLimits{}) {
		t.ConsecutiveFailures = CountLimits{Degraded: 3, Unhealthy: 10}
	}
	if t.QueueDepth == (CountLimits{}) {
		t.QueueDepth = CountLimits{Degraded: 50, Unhealthy: 100}
	}
	if t.FailureRate == (RateLimits{}) {
		t.FailureRate = RateLimits{Degraded: 0.3, Unhealthy: 0.7}
	}
	if t.UnhealthyLevel == Unknown {
		t.UnhealthyLevel = Critical
	}
	return c
}

// Validate reports the first field that breaks a rule, named as in YAML.
func (c Config) Validate() error {
	switch {
	case c.HeartbeatInterval <= 0:
		return invalid("heartbeat_interval must be positive, got %s", c.HeartbeatInterval)
	case bad(c.HeartbeatTolerance) || c.HeartbeatTolerance <= 0 || c.HeartbeatTolerance > 10:
		return invalid("heartbeat_tolerance must be in (0, 10], got %g", c.HeartbeatTolerance)
	case float64(c.HeartbeatTimeout) <= float64(c.HeartbeatInterval)*(1+c.HeartbeatTolerance):
		return invalid("heartbeat_timeout must be more than heartbeat_interval × (1 + heartbeat_tolerance) = %s, got %s",
			time.Duration(float64(c.HeartbeatInterval)*(1+c.HeartbeatTolerance)), c.HeartbeatTimeout)
	case c.Window < 2*c.HeartbeatInterval:
		return invalid("window must be at least 2 × heartbeat_interval (%s), got %s", 2*c.HeartbeatInterval, c.Window)
	case c.MinTasks < 1:
		return invalid("min_tasks must be at least 1, got %d", c.MinTasks)
	case bad(c.UtilisationOK) || c.UtilisationOK <= 0 || c.UtilisationOK >= 1:
		return invalid("utilisation_ok must be in (0, 1), got %g", c.UtilisationOK)
	}
	if err := c.Weights.validate(); err != nil {
		return err
	}
	if err := c.Levels.validate(); err != nil {
		return err
	}
	return c.Thresholds.validate()
}

func (w Weights) validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"self_reported", w.SelfReported}, {"heartbeat_regularity", w.HeartbeatRegularity},
		{"task_completion", w.TaskCompletion}, {"resource_utilisation", w.ResourceUtilisation},
		{"error_rate", w.ErrorRate},
	} {
		if bad(f.v) || f.v < 0 {
			return invalid("weights.%s must not be negative, got %g", f.name, f.v)
		}
	}
	if w.SelfReported+w.HeartbeatRegularity+w.TaskCompletion+w.ResourceUtilisation+w.ErrorRate <= 0 {
		return invalid("weights: at least one weight must be positive")
	}
	return nil
}

func (l LevelThresholds) validate() error {
	switch {
	case bad(l.Healthy) || l.Healthy > 1 || l.Healthy <= l.Degraded:
		return invalid("levels.healthy must be at most 1 and above levels.degraded (%g), got %g", l.Degraded, l.Healthy)
	case bad(l.Degraded) || l.Degraded <= l.Warning:
		return invalid("levels.degraded must be above levels.warning (%g), got %g", l.Warning, l.Degraded)
	case bad(l.Warning) || l.Warning <= l.Critical:
		return invalid("levels.warning must be above levels.critical (%g), got %g", l.Critical, l.Warning)
	case bad(l.Critical) || l.Critical <= 0:
		return invalid("levels.critical must be positive, got %g", l.Critical)
	}
	return nil
}

func (t Thresholds) validate() error {
	for _, f := range []struct {
		name string
		l    CountLimits
	}{{"consecutive_failures", t.ConsecutiveFailures}, {"queue_depth", t.QueueDepth}} {
		if f.l.Degraded < 1 || f.l.Unhealthy <= f.l.Degraded {
			return invalid("thresholds.%s: degraded must be at least 1 and unhealthy above it, got %d and %d",
				f.name, f.l.Degraded, f.l.Unhealthy)
		}
	}
	r := t.FailureRate
	if bad(r.Degraded) || bad(r.Unhealthy) || r.Degraded <= 0 || r.Unhealthy <= r.Degraded || r.Unhealthy > 1 {
		return invalid("thresholds.failure_rate: want 0 < degraded < unhealthy ≤ 1, got %g and %g", r.Degraded, r.Unhealthy)
	}
	switch t.UnhealthyLevel {
	case Warning, Critical, Failed:
	default:
		return invalid("thresholds.unhealthy_level must be warning, critical or failed, got %s", t.UnhealthyLevel)
	}
	return nil
}

func bad(f float64) bool { return math.IsNaN(f) || math.IsInf(f, 0) }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

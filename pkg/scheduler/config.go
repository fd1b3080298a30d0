package scheduler

import (
	"fmt"
	"time"

	"github.com/wardenhq/warden/pkg/config"
	"github.com/wardenhq/warden/pkg/natsconn"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/retry"
	"github.com/wardenhq/warden/pkg/selection"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// Config is the scheduler's configuration (configs/scheduler.yaml).
type Config struct {
	NATS natsconn.Options `yaml:"nats"`
	// Replicas of every stream and bucket. Defaults to 1.
	Replicas int `yaml:"replicas"`
	// TaskShards is the number of task streams. Defaults to 4.
	TaskShards int `yaml:"task_shards"`
	// MaxSpecBytes is the largest submission accepted. Defaults to 262144.
	MaxSpecBytes int `yaml:"max_spec_bytes"`
	// MaxSteps is the largest number of steps in a job. Defaults to 1000.
	MaxSteps int `yaml:"max_steps"`
	// DefaultStepTimeout applies to steps without a timeout. Defaults to 5m.
	DefaultStepTimeout protocol.Duration `yaml:"default_step_timeout"`
	// RetryConfig is the retry configuration file (configs/retry.yaml):
	// policies per action and failure classification. Defaults to "" (the
	// built-in defaults written out in configs/retry.yaml).
	RetryConfig string `yaml:"retry_config"`
	// Retry is the loaded retry configuration; set it directly when
	// embedding the scheduler. Not read from YAML.
	Retry *retry.Config `yaml:"-"`
	// DefaultTaskExpiry applies to steps without expires_in: a step not
	// started this long after submission fails as expired. Defaults to 0
	// (no expiry).
	DefaultTaskExpiry protocol.Duration `yaml:"default_task_expiry"`
	// DispatchGrace is added to a step's timeout to form its lease
	// (locked_until): time for the task to wait in the agent's queue and for
	// the result to travel back. Defaults to 30s.
	DispatchGrace protocol.Duration `yaml:"dispatch_grace"`
	// WaitRetry is how soon a message whose step found no agent is handled
	// again. Defaults to 1s.
	WaitRetry protocol.Duration `yaml:"wait_retry"`
	// CapacityRetry is how soon a message whose step found every eligible
	// agent at max_concurrent is handled again. Defaults to 200ms.
	CapacityRetry protocol.Duration `yaml:"capacity_retry"`
	// Selection chooses agents (strategies per pool, health factors).
	Selection selection.Config `yaml:"selection"`
	// Workers handle messages concurrently; a job always goes to the same
	// worker. Defaults to 16.
	Workers int `yaml:"workers"`
	// MetricsAddr serves /metrics; empty disables. Defaults to ":9101".
	MetricsAddr string `yaml:"metrics_addr"`
	// LogLevel is debug, info, warn or error. Defaults to info.
	LogLevel string `yaml:"log_level"`
}

// DefaultConfig returns the configuration with every default filled in.
func DefaultConfig() Config {
	return Config{Selection: selection.DefaultConfig()}.WithDefaults()
}

// WithDefaults fills every zero field with its default.
func (c Config) WithDefaults() Config {
	if c.Selection.Strategy == "" {
		// A zero selection config (a Config built in code) means defaults:
		// its zero health factors would exclude every agent.
		c.Selection = selection.DefaultConfig()
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.TaskShards == 0 {
		c.TaskShards = streams.DefaultTaskShards
	}
	if c.MaxSpecBytes == 0 {
		c.MaxSpecBytes = spec.DefaultLimits.MaxBytes
	}
	if c.MaxSteps == 0 {
		c.MaxSteps = spec.DefaultLimits.MaxSteps
	}
	if c.DefaultStepTimeout == 0 {
		c.DefaultStepTimeout = protocol.Duration(5 * time.Minute)
	}
	if c.DispatchGrace == 0 {
		c.DispatchGrace = protocol.Duration(30 * time.Second)
	}
	if c.WaitRetry == 0 {
		c.WaitRetry = protocol.Duration(time.Second)
	}
	if c.CapacityRetry == 0 {
		c.CapacityRetry = protocol.Duration(200 * time.Millisecond)
	}
	if c.Workers == 0 {
		c.Workers = 16
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	return c
}

// Validate reports the first field that breaks a rule.
func (c Config) Validate() error {
	switch {
	case c.Replicas < 1 || c.Replicas > 5:
		return fmt.Errorf("replicas must be between 1 and 5, got %d", c.Replicas)
	case c.TaskShards < 1:
		return fmt.Errorf("task_shards must be at least 1, got %d", c.TaskShards)
	case c.MaxSpecBytes < 1024 || c.MaxSpecBytes > 1<<20:
		return fmt.Errorf("max_spec_bytes must be between 1024 and 1048576 (the NATS payload limit), got %d", c.MaxSpecBytes)
	case c.Workers < 1:
		return fmt.Errorf("workers must be at least 1, got %d", c.Workers)
	}
	return nil
}

func (c Config) limits() spec.Limits {
	return spec.Limits{MaxBytes: c.MaxSpecBytes, MaxSteps: c.MaxSteps}
}

func (c Config) streamOptions() streams.Options {
	return streams.Options{Replicas: c.Replicas, TaskShards: c.TaskShards}
}

// loadRetry returns the retry configuration: Retry if set, else the file
// RetryConfig decoded onto the defaults.
func (c Config) loadRetry() (retry.Config, error) {
	if c.Retry != nil {
		return c.Retry.WithDefaults(), c.Retry.WithDefaults().Validate()
	}
	rc := retry.DefaultConfig()
	if err := config.Load(c.RetryConfig, &rc); err != nil {
		return rc, fmt.Errorf("retry_config %s: %w", c.RetryConfig, err)
	}
	rc = rc.WithDefaults()
	if err := rc.Validate(); err != nil {
		return rc, fmt.Errorf("retry_config %s: %w", c.RetryConfig, err)
	}
	return rc, nil
}

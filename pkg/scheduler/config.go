package scheduler

import (
	"fmt"
	"time"

	"github.com/wardenhq/warden/pkg/natsconn"
	"github.com/wardenhq/warden/pkg/protocol"
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
	// DefaultMaxRetries applies to steps without max_retries. Defaults to 3.
	DefaultMaxRetries int `yaml:"default_max_retries"`
	// DefaultTaskExpiry applies to steps without expires_in: a step not
	// started this long after submission fails as expired. Defaults to 0
	// (no expiry).
	DefaultTaskExpiry protocol.Duration `yaml:"default_task_expiry"`
	// RetryUnclassified says whether a failure the agent did not classify
	// and no pattern recognises is retried. Defaults to false (permanent).
	RetryUnclassified bool `yaml:"retry_unclassified"`
	// DispatchGrace is added to a step's timeout to form its lease
	// (locked_until): time for the task to wait in the agent's queue and for
	// the result to travel back. Defaults to 30s.
	DispatchGrace protocol.Duration `yaml:"dispatch_grace"`
	// WaitRetry is how soon a message whose step found no agent is handled
	// again. Defaults to 1s.
	WaitRetry protocol.Duration `yaml:"wait_retry"`
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
	return Config{}.WithDefaults()
}

// WithDefaults fills every zero field with its default.
func (c Config) WithDefaults() Config {
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
	if c.DefaultMaxRetries == 0 {
		c.DefaultMaxRetries = 3
	}
	if c.DispatchGrace == 0 {
		c.DispatchGrace = protocol.Duration(30 * time.Second)
	}
	if c.WaitRetry == 0 {
		c.WaitRetry = protocol.Duration(time.Second)
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
	case c.DefaultMaxRetries < 0:
		return fmt.Errorf("default_max_retries must not be negative, got %d", c.DefaultMaxRetries)
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

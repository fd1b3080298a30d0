package supervisor

import (
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nuid"

	"github.com/wardenhq/warden/internal/natsconn"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// Config is the supervisor's configuration (configs/supervisor.yaml).
type Config struct {
	NATS natsconn.Options `yaml:"nats"`
	// ID names this supervisor in the lease. Defaults to <host>-<random>.
	ID string `yaml:"id"`
	// Replicas of every stream and bucket, 1..5. Defaults to 1.
	Replicas int `yaml:"replicas"`
	// TaskShards is the number of task streams, 1..128. Defaults to 4.
	TaskShards int `yaml:"task_shards"`
	// Partitions is the schedulers' partition count, 1..1024; the
	// supervisor applies the streams with it, so it must match theirs.
	// Defaults to 8.
	Partitions int `yaml:"partitions"`
	// LeaseTTL is how long a dead leader keeps leadership. Defaults to 5s.
	LeaseTTL protocol.Duration `yaml:"lease_ttl"`
	// RecoveryGrace is how long a pending step or a stalled job is left to
	// the schedulers before the leader asks one to advance it. Defaults to 30s.
	RecoveryGrace protocol.Duration `yaml:"recovery_grace"`
	// RecoveryRetry is how soon a recovery that failed is tried again; at
	// least 100ms. Defaults to 1s.
	RecoveryRetry protocol.Duration `yaml:"recovery_retry"`
	// FailureThreshold is how long an agent whose presence expired may take
	// to come back before its tasks are transferred. Defaults to 1s.
	FailureThreshold protocol.Duration `yaml:"failure_threshold"`
	// PoisonThreshold is how many times a step may be taken back from its
	// agent (lease expired, agent failed) before it is parked in the
	// dead-letter stream. Defaults to 3.
	PoisonThreshold int `yaml:"poison_threshold"`
	// AdvanceTimeout is how long the leader waits for a scheduler to answer
	// an advance request (the leader never dispatches itself; it asks a
	// scheduler to advance a job whose step it released). A request not
	// answered in time is asked again after recovery_retry. At least
	// 100ms. Defaults to 5s.
	AdvanceTimeout protocol.Duration `yaml:"advance_timeout"`
	// HealthConfig is the health assessment file (configs/health.yaml),
	// read once by New: a change takes a restart, and a file that went bad
	// meanwhile cannot stop the leader. Defaults to "" (the built-in
	// defaults written out there).
	HealthConfig string `yaml:"health_config"`
	// CycleInterval is how often the leader assesses agents and heals; at
	// least 100ms. Defaults to 5s.
	CycleInterval protocol.Duration `yaml:"cycle_interval"`
	// SelfHealing turns the healing actions on (deprioritise degraded,
	// reduce load on warning, drain critical, fail over failed); off, the
	// leader still assesses. Defaults to true (see DefaultConfig).
	SelfHealing bool `yaml:"self_healing"`
	// DrainTimeout is how long a drained critical agent may finish its
	// tasks before what remains is transferred. Defaults to 30s.
	DrainTimeout protocol.Duration `yaml:"drain_timeout"`
	// AnchorInterval is how often the leader moves each work-queue stream's
	// anchor to the stream's newest message, if anything was stored since
	// (internal/anchor). At least 100ms; negative (-1s) turns anchors off.
	// Defaults to 1s.
	AnchorInterval protocol.SignedDuration `yaml:"anchor_interval"`
	// MetricsAddr serves /metrics; empty disables. Defaults to "".
	MetricsAddr string `yaml:"metrics_addr"`
	// LogLevel is debug, info, warn or error. Defaults to info.
	LogLevel string `yaml:"log_level"`
	// PprofAddr serves net/http/pprof (CPU and heap profiles) here, e.g.
	// "127.0.0.1:6062"; empty disables it. Defaults to "".
	PprofAddr string `yaml:"pprof_addr"`
}

// DefaultConfig returns the configuration with every default filled in.
func DefaultConfig() Config { return Config{SelfHealing: true}.WithDefaults() }

// WithDefaults fills every zero field with its default.
func (c Config) WithDefaults() Config {
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = host + "-" + nuid.Next()[:8]
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.TaskShards == 0 {
		c.TaskShards = streams.DefaultTaskShards
	}
	if c.Partitions == 0 {
		c.Partitions = streams.DefaultPartitions
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = protocol.Duration(5 * time.Second)
	}
	if c.RecoveryGrace == 0 {
		c.RecoveryGrace = protocol.Duration(30 * time.Second)
	}
	if c.RecoveryRetry == 0 {
		c.RecoveryRetry = protocol.Duration(time.Second)
	}
	if c.FailureThreshold == 0 {
		c.FailureThreshold = protocol.Duration(time.Second)
	}
	if c.PoisonThreshold == 0 {
		c.PoisonThreshold = 3
	}
	if c.AdvanceTimeout == 0 {
		c.AdvanceTimeout = protocol.Duration(5 * time.Second)
	}
	if c.CycleInterval == 0 {
		c.CycleInterval = protocol.Duration(5 * time.Second)
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = protocol.Duration(30 * time.Second)
	}
	if c.AnchorInterval == 0 {
		c.AnchorInterval = protocol.SignedDuration(time.Second)
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	return c
}

// streamOptions are the stream definitions this supervisor applies.
func (c Config) streamOptions() streams.Options {
	return streams.Options{Replicas: c.Replicas, TaskShards: c.TaskShards, Partitions: c.Partitions, LeaseTTL: c.LeaseTTL.Std()}
}

// minInterval is the smallest interval of a loop (cycle_interval,
// recovery_retry, anchor_interval) and the smallest advance_timeout: less
// turns a ticker into a busy loop, or every request into a timeout.
const minInterval = 100 * time.Millisecond

// Validate reports the first field that breaks a rule. Call it on a
// configuration with its defaults filled in (WithDefaults): a zero field
// is the default, a negative one an error.
func (c Config) Validate() error {
	// The schedulers' bounds (streams.Options): the supervisor writes
	// these into the deployment record, which no scheduler could start
	// with were they out of them.
	if err := c.streamOptions().Validate(); err != nil {
		return err
	}
	switch {
	case c.LeaseTTL.Std() < time.Second:
		return fmt.Errorf("lease_ttl must be at least 1s, got %s", c.LeaseTTL)
	case c.PoisonThreshold < 1:
		return fmt.Errorf("poison_threshold must be at least 1, got %d", c.PoisonThreshold)
	case c.CycleInterval.Std() < minInterval:
		return fmt.Errorf("cycle_interval must be at least %s, got %s", minInterval, c.CycleInterval)
	case c.RecoveryRetry.Std() < minInterval:
		return fmt.Errorf("recovery_retry must be at least %s, got %s", minInterval, c.RecoveryRetry)
	case c.AdvanceTimeout.Std() < minInterval:
		return fmt.Errorf("advance_timeout must be at least %s, got %s", minInterval, c.AdvanceTimeout)
	case c.AnchorInterval >= 0 && c.AnchorInterval.Std() < minInterval:
		return fmt.Errorf("anchor_interval must be at least %s (or negative: anchors off), got %s", minInterval, c.AnchorInterval)
	case c.RecoveryGrace < 0 || c.FailureThreshold < 0 || c.DrainTimeout < 0:
		return fmt.Errorf("recovery_grace, failure_threshold and drain_timeout must not be negative, got %s, %s and %s",
			c.RecoveryGrace, c.FailureThreshold, c.DrainTimeout)
	}
	return nil
}

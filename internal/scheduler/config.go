package scheduler

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/config"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natsconn"
	"github.com/wardenhq/warden/internal/ratelimit"
	"github.com/wardenhq/warden/internal/retry"
	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/internal/selection"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// Config is the scheduler's configuration (configs/scheduler.yaml).
type Config struct {
	NATS natsconn.Options `yaml:"nats"`
	// Replicas of every stream and bucket, 1..5. Defaults to 1.
	Replicas int `yaml:"replicas"`
	// TaskShards is the number of task streams, 1..128. Defaults to 4.
	TaskShards int `yaml:"task_shards"`
	// MaxSpecBytes is the largest submission accepted. Defaults to 262144.
	MaxSpecBytes int `yaml:"max_spec_bytes"`
	// MaxSteps is the largest number of steps in a job; at least 1.
	// Defaults to 1000.
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
	// again. It is the durable fallback only: a waiting step is retried as
	// soon as an agent appears or frees a slot. At least 100ms. Defaults
	// to 30s.
	WaitRetry protocol.Duration `yaml:"wait_retry"`
	// CapacityRetry is how soon a job whose step found every eligible
	// agent at max_concurrent is tried again if no freed slot wakes it
	// first. Its messages stay unacknowledged in the scheduler meanwhile
	// (extended past AckWait), not handed back. At least 10ms. Defaults to
	// 200ms.
	CapacityRetry protocol.Duration `yaml:"capacity_retry"`
	// Selection chooses agents (strategies per pool, health factors).
	Selection selection.Config `yaml:"selection"`
	// Workers handle messages concurrently; a job always goes to the same
	// worker, which keeps its records between messages. Defaults to 16.
	Workers int `yaml:"workers"`
	// Partitions splits submissions and results by job id (the streams'
	// subject transform); one scheduler process at a time owns a partition
	// (a pinned consumer), so it can trust the records it cached. Every
	// process must use the same number, 1..1024. Defaults to 8.
	Partitions int `yaml:"partitions"`
	// PinnedTTL is how long a partition stays with a scheduler that stopped
	// pulling (frozen, partitioned) before another may take it. Defaults to
	// 5s; at least 2s (the owner renews it by pulling every half TTL).
	PinnedTTL protocol.Duration `yaml:"pinned_ttl"`
	// AckWait bounds how long a scheduler may hold a submission or result
	// without acknowledging it before another may take it; held messages are
	// extended while genuinely being worked on. Defaults to 5s.
	AckWait protocol.Duration `yaml:"ack_wait"`
	// WriteTimeout bounds waiting for one round of PubAcks; at least
	// 100ms. Defaults to 10s.
	WriteTimeout protocol.Duration `yaml:"write_timeout"`
	// MaxJobShare is the largest share (0..1] of the slots of a pool's
	// agents for an action that one job of several steps may hold at once:
	// a fan-out never takes every slot, so other jobs start beside it.
	// 1 disables the limit. Defaults to 0.5.
	MaxJobShare float64 `yaml:"max_job_share"`
	// Retention is how long a finished job's records are kept (a per-record
	// TTL, written on every record of the job when it ends). At least 1s
	// (the server's smallest TTL); a negative value (-1s) keeps them
	// forever. Defaults to 168h.
	Retention protocol.SignedDuration `yaml:"retention"`
	// MetricsAddr serves /metrics; empty disables. Defaults to ":9101".
	MetricsAddr string `yaml:"metrics_addr"`
	// LogLevel is debug, info, warn or error. Defaults to info.
	LogLevel string `yaml:"log_level"`
	// GCPercent is the process's garbage collection target, as GOGC (which
	// wins when set): the scheduler's live heap is small and its allocation
	// rate high, so the Go default of 100 collects several times a second
	// under load. -1 turns collection off. Defaults to 400
	// (docs/performance.md, "Session 8").
	GCPercent int `yaml:"gc_percent"`
	// PprofAddr serves net/http/pprof (CPU and heap profiles) here, e.g.
	// "127.0.0.1:6061"; empty disables it. Defaults to "".
	PprofAddr string `yaml:"pprof_addr"`
	// RateLimits are the named limits steps reference with rate_limit:
	// name: {limit: N, interval: 1s, burst: B}. Every scheduler must define
	// the same ones; they are enforced together. Defaults to none.
	RateLimits ratelimit.Config `yaml:"rate_limits"`
	// PriorityAging is how long a step waiting for capacity takes to gain
	// one priority level (the guard against starvation): a low step waits
	// at most 3 × this behind higher work. Defaults to 30s.
	PriorityAging protocol.Duration `yaml:"priority_aging"`
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
		c.WaitRetry = protocol.Duration(30 * time.Second)
	}
	if c.CapacityRetry == 0 {
		c.CapacityRetry = protocol.Duration(200 * time.Millisecond)
	}
	if c.Workers == 0 {
		c.Workers = 16
	}
	if c.Partitions == 0 {
		c.Partitions = streams.DefaultPartitions
	}
	if c.PinnedTTL == 0 {
		c.PinnedTTL = protocol.Duration(5 * time.Second)
	}
	if c.AckWait == 0 {
		c.AckWait = protocol.Duration(5 * time.Second)
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = protocol.Duration(10 * time.Second)
	}
	if c.MaxJobShare == 0 {
		c.MaxJobShare = 0.5
	}
	if c.Retention == 0 {
		c.Retention = protocol.SignedDuration(jobstore.DefaultRetention)
	}
	if c.PriorityAging == 0 {
		c.PriorityAging = protocol.Duration(30 * time.Second)
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.GCPercent == 0 {
		c.GCPercent = DefaultGCPercent
	}
	return c
}

// DefaultGCPercent is gc_percent's default.
const DefaultGCPercent = 400

// Validate reports the first field that breaks a rule. Call it on a
// configuration with its defaults filled in (WithDefaults): a zero field is
// the default, a negative one an error.
func (c Config) Validate() error {
	// replicas, task_shards and partitions: the bounds every process
	// that applies the streams checks (supervisor, warden setup).
	if err := c.streamOptions().Validate(); err != nil {
		return err
	}
	switch {
	case c.MaxSpecBytes < 1024 || c.MaxSpecBytes > 1<<20:
		return fmt.Errorf("max_spec_bytes must be between 1024 and 1048576 (the NATS payload limit), got %d", c.MaxSpecBytes)
	case c.MaxSteps < 1:
		return fmt.Errorf("max_steps must be at least 1, got %d", c.MaxSteps)
	case c.Workers < 1:
		return fmt.Errorf("workers must be at least 1, got %d", c.Workers)
	case c.WaitRetry.Std() < 100*time.Millisecond:
		return fmt.Errorf("wait_retry must be at least 100ms, got %s", c.WaitRetry)
	case c.CapacityRetry.Std() < 10*time.Millisecond:
		return fmt.Errorf("capacity_retry must be at least 10ms, got %s", c.CapacityRetry)
	case c.WriteTimeout.Std() < 100*time.Millisecond:
		return fmt.Errorf("write_timeout must be at least 100ms, got %s", c.WriteTimeout)
	case c.Retention > 0 && c.Retention.Std() < time.Second:
		// The server refuses a smaller Nats-TTL: no job could finish.
		return fmt.Errorf("retention must be at least 1s (or negative: kept forever), got %s", c.Retention.Std())
	case c.GCPercent < -1:
		return fmt.Errorf("gc_percent must be -1 (off) or positive, got %d", c.GCPercent)
	case c.MaxJobShare < 0 || c.MaxJobShare > 1:
		return fmt.Errorf("max_job_share must be in (0, 1], got %g", c.MaxJobShare)
	case c.AckWait.Std() < time.Second:
		return fmt.Errorf("ack_wait must be at least 1s, got %s", c.AckWait.Std())
	case c.PinnedTTL.Std() < 2*time.Second:
		// The owner renews its pin with a pull request every half TTL,
		// and a pull request lasts at least 1 s.
		return fmt.Errorf("pinned_ttl must be at least 2s, got %s", c.PinnedTTL.Std())
	}
	return c.RateLimits.Validate()
}

func (c Config) limits() spec.Limits {
	return spec.Limits{MaxBytes: c.MaxSpecBytes, MaxSteps: c.MaxSteps}
}

// limitsFor are the limits a submission with headers h is parsed with: a
// delayed one released, or a schedule's tick, was accepted before (or its
// definition was), and is not held to input checks added since
// (spec.Limits.Accepted).
func (c Config) limitsFor(h nats.Header) spec.Limits {
	l := c.limits()
	l.Accepted = schedule.Released(h)
	return l
}

func (c Config) streamOptions() streams.Options {
	return streams.Options{Replicas: c.Replicas, TaskShards: c.TaskShards, Partitions: c.Partitions}
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

package agent

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/wardenhq/warden/internal/actions"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// Config is an agent's configuration, decoded from configs/agent.yaml. Every
// field has a default filled by WithDefaults; Validate checks the result.
type Config struct {
	// ID names the agent; it is its durable consumer name and presence key.
	// Defaults to the host name (reduced to letters, digits, '-' and '_').
	ID string `yaml:"id"`
	// Pool the agent serves. Defaults to "default".
	Pool string `yaml:"pool"`
	// Capabilities the scheduler matches steps against. Defaults to none.
	Capabilities []string `yaml:"capabilities"`
	// Labels are free-form key/values shown in presence. Defaults to none.
	Labels map[string]string `yaml:"labels"`
	// MaxConcurrent is how many tasks run at once; it is also the consumer's
	// max_ack_pending. Defaults to 4.
	MaxConcurrent int `yaml:"max_concurrent"`
	// HeartbeatInterval between presence heartbeats. Defaults to 1s; must be
	// less than half the presence bucket's TTL.
	HeartbeatInterval protocol.Duration `yaml:"heartbeat_interval"`
	// Lease is the consumer's AckWait: how long a task stays with this agent
	// without news. The agent extends it every lease/3 while a handler runs.
	// Defaults to 10s.
	Lease protocol.Duration `yaml:"lease"`
	// MaxDeliver bounds deliveries of one task message (-1: unbounded).
	// Defaults to 5.
	MaxDeliver int `yaml:"max_deliver"`
	// TaskShards is the number of task streams of the deployment, 1 to
	// streams.MaxTaskShards (128); it must match the scheduler's. Defaults
	// to 4.
	TaskShards int `yaml:"task_shards"`
	// DrainTimeout is how long in-flight tasks may finish after a stop
	// request before they are cancelled and handed back. Defaults to 30s.
	DrainTimeout protocol.Duration `yaml:"drain_timeout"`
	// FetchWait is how long one pull request waits for a task. Defaults to 30s.
	FetchWait protocol.Duration `yaml:"fetch_wait"`
	// ConsumerInactiveThreshold is the task consumer's inactive_threshold:
	// the server deletes the consumer once the agent has neither asked for
	// work nor held a task for this long, so agents that never come back
	// (autoscaled hosts, renamed ids) do not pile up consumers (each ack
	// scans every consumer of its shard, and a shard takes at most 1,000).
	// An agent that comes back creates it again and finds its queued tasks.
	// Defaults to 24h; negative: never deleted.
	ConsumerInactiveThreshold protocol.Duration `yaml:"consumer_inactive_threshold"`
	// Actions this agent runs. Defaults to none listed, which means every
	// handler registered in code plus the harmless built-ins echo and sleep.
	// When listed, exactly these run: shell and http run only when listed.
	Actions []string `yaml:"actions"`
	// Shell configures the shell built-in.
	Shell ShellConfig `yaml:"shell"`
	// HTTP configures the http built-in.
	HTTP HTTPConfig `yaml:"http"`
	// MetricsAddr serves Prometheus /metrics, e.g. ":9102". Defaults to "" (off).
	MetricsAddr string `yaml:"metrics_addr"`
	// LogLevel is debug, info, warn or error. Defaults to info.
	LogLevel string `yaml:"log_level"`
	// MaxResultBytes bounds a result message: an output (and error) that
	// would make it larger is truncated, and the result says so
	// (truncated: true). It must stay below the server's max_payload
	// (1 MiB by default) with room for headers. Defaults to 262144.
	MaxResultBytes int `yaml:"max_result_bytes"`
	// Cluster names the agent cluster this agent is a member of
	// (docs/clusters.md). Defaults to "" (none).
	Cluster string `yaml:"cluster"`
	// NATS says where to connect. Defaults to NATS_URL / NATS_CREDS, then
	// nats://127.0.0.1:4222.
	NATS NATSOptions `yaml:"nats"`
}

// Defaults.
const (
	DefaultPool              = "default"
	DefaultMaxConcurrent     = 4
	DefaultHeartbeatInterval = time.Second
	DefaultLease             = 10 * time.Second
	DefaultMaxDeliver        = 5
	DefaultDrainTimeout      = 30 * time.Second
	DefaultFetchWait         = 30 * time.Second
	// DefaultConsumerInactiveThreshold outlasts a night's outage and a
	// weekend's scale-down is still cleaned up.
	DefaultConsumerInactiveThreshold = 24 * time.Hour
	DefaultLogLevel                  = "info"
	DefaultMaxResultBytes            = 256 << 10
	maxResultBytesLimit              = 900 << 10

	// maxConcurrentLimit is the task consumer's max_waiting bound.
	maxConcurrentLimit = 512
	minLease           = 300 * time.Millisecond
)

// DefaultConfig returns a Config with every default filled in.
func DefaultConfig() Config { return Config{}.WithDefaults() }

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.ID == "" {
		c.ID = hostID()
	}
	if c.Pool == "" {
		c.Pool = DefaultPool
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = DefaultMaxConcurrent
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = protocol.Duration(DefaultHeartbeatInterval)
	}
	if c.Lease == 0 {
		c.Lease = protocol.Duration(DefaultLease)
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	if c.TaskShards == 0 {
		c.TaskShards = streams.DefaultTaskShards
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = protocol.Duration(DefaultDrainTimeout)
	}
	if c.FetchWait == 0 {
		c.FetchWait = protocol.Duration(DefaultFetchWait)
	}
	if c.ConsumerInactiveThreshold == 0 {
		c.ConsumerInactiveThreshold = protocol.Duration(DefaultConsumerInactiveThreshold)
	}
	if c.Shell.TailBytes == 0 {
		c.Shell.TailBytes = actions.DefaultTailBytes
	}
	if c.HTTP.TailBytes == 0 {
		c.HTTP.TailBytes = actions.DefaultTailBytes
	}
	if c.LogLevel == "" {
		c.LogLevel = DefaultLogLevel
	}
	if c.MaxResultBytes == 0 {
		c.MaxResultBytes = DefaultMaxResultBytes
	}
	return c
}

// Validate reports every invalid field, each error naming the field and rule.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.MaxResultBytes < 1024 || c.MaxResultBytes > maxResultBytesLimit {
		bad("max_result_bytes must be between 1024 and %d (below the server's max_payload), got %d", maxResultBytesLimit, c.MaxResultBytes)
	}
	if !protocol.ValidToken(c.ID) {
		bad("id %q must be 1-128 characters of letters, digits, '-' or '_'", c.ID)
	}
	if c.Cluster != "" && !protocol.ValidToken(c.Cluster) {
		bad("cluster %q must be 1-128 characters of letters, digits, '-' or '_'", c.Cluster)
	}
	if !protocol.ValidToken(c.Pool) {
		bad("pool %q must be 1-128 characters of letters, digits, '-' or '_'", c.Pool)
	}
	for i, capability := range c.Capabilities {
		if problem := protocol.CapabilityProblem(capability); problem != "" {
			bad("capabilities[%d] %q %s (steps could never require it)", i, capability, problem)
		}
	}
	if c.MaxConcurrent < 1 || c.MaxConcurrent > maxConcurrentLimit {
		bad("max_concurrent must be between 1 and %d, got %d", maxConcurrentLimit, c.MaxConcurrent)
	}
	if c.HeartbeatInterval <= 0 {
		bad("heartbeat_interval must be positive")
	}
	if c.Lease.Std() < minLease {
		bad("lease must be at least %s, got %s", minLease, c.Lease)
	}
	if c.MaxDeliver < -1 || c.MaxDeliver == 0 {
		bad("max_deliver must be at least 1, or -1 for unbounded, got %d", c.MaxDeliver)
	}
	if c.TaskShards < 1 || c.TaskShards > streams.MaxTaskShards {
		// The scheduler's bound (streams.Options.Validate): an agent on a
		// shard no scheduler has would wait for tasks that never come.
		bad("task_shards must be between 1 and %d, got %d", streams.MaxTaskShards, c.TaskShards)
	}
	if c.DrainTimeout < 0 {
		bad("drain_timeout must not be negative")
	}
	if c.FetchWait.Std() < time.Second {
		bad("fetch_wait must be at least 1s, got %s", c.FetchWait)
	}
	if t := c.ConsumerInactiveThreshold.Std(); t > 0 && t < time.Second {
		bad("consumer_inactive_threshold must be at least 1s (negative: never), got %s", c.ConsumerInactiveThreshold)
	}
	seen := map[string]bool{}
	for i, a := range c.Actions {
		switch {
		case !protocol.ValidToken(a):
			bad("actions[%d] %q must be letters, digits, '-' or '_'", i, a)
		case seen[a]:
			bad("actions[%d] %q is listed twice", i, a)
		}
		seen[a] = true
	}
	for i, cmd := range c.Shell.AllowedCommands {
		if cmd == "" {
			bad("shell.allowed_commands[%d] must not be empty", i)
		}
	}
	if c.Shell.TailBytes < 1 {
		bad("shell.tail_bytes must be positive, got %d", c.Shell.TailBytes)
	}
	if err := c.Shell.Validate(); err != nil {
		bad("shell: %v", err)
	}
	if c.HTTP.TailBytes < 1 {
		bad("http.tail_bytes must be positive, got %d", c.HTTP.TailBytes)
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		bad("log_level must be debug, info, warn or error, got %q", c.LogLevel)
	}
	return errors.Join(errs...)
}

var nonToken = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// hostID derives a default agent id from the host name.
func hostID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "agent"
	}
	h, _, _ = strings.Cut(h, ".")
	h = nonToken.ReplaceAllString(h, "-")
	if len(h) > 128 {
		h = h[:128]
	}
	return h
}

package dev

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/wardenhq/warden/pkg/spec"
)

// Config configures Run. Every field has a default.
type Config struct {
	// DataDir holds the server's JetStream data. Defaults to ./.warden.
	DataDir string
	// Host the server listens on. Defaults to 127.0.0.1.
	Host string
	// Port the server listens on; -1 picks a free one. Defaults to 4222.
	Port int
	// BinDir holds the scheduler, supervisor and agent binaries. Defaults
	// to the directory of the running executable.
	BinDir string
	// ConfigDir holds scheduler.yaml and supervisor.yaml, passed to those
	// children with --config when present, and agent.yaml, the base of the
	// agents' generated configuration. Defaults to BinDir/../configs.
	ConfigDir string
	// Agents is how many agents to start. Defaults to 3.
	Agents int
	// Pool the agents join. Defaults to "default".
	Pool string
	// TaskShards is the number of task streams. Defaults to streams'.
	TaskShards int
	// MetricsPort is the first port of the children's /metrics endpoints
	// (scheduler, supervisor, then agents); 0 does not pass --metrics-addr.
	// Defaults to 0; the warden CLI passes 9300.
	MetricsPort int
	// APIAddr is where `warden api` (the warden binary in BinDir) serves
	// the HTTP API and dashboard, with anonymous admin access: keep it on
	// a loopback address. Empty, or no warden binary: not started.
	// Defaults to ""; the warden CLI passes 127.0.0.1:8080.
	APIAddr string
	// ReadyTimeout bounds the wait for every agent to be present.
	// Defaults to 30s.
	ReadyTimeout time.Duration
	// ShutdownTimeout bounds how long a child may take to exit after
	// SIGTERM before it is killed. Defaults to 15s.
	ShutdownTimeout time.Duration
	// Out receives the children's prefixed output and Run's own messages.
	// Defaults to os.Stdout.
	Out io.Writer
	// OnReady, if set, runs once every agent is present (the demo). Its
	// error is reported; Run keeps going unless ExitAfterReady.
	OnReady func(ctx context.Context, env Env) error
	// ExitAfterReady stops everything once OnReady returns and makes Run
	// return its error: for scripts and tests.
	ExitAfterReady bool
}

func (c Config) withDefaults() (Config, error) {
	if c.DataDir == "" {
		c.DataDir = ".warden"
	}
	if c.Host == "" {
		c.Host = "127.0.0.1"
	}
	if c.Port == 0 {
		c.Port = 4222
	}
	if c.BinDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return c, fmt.Errorf("locate own executable: %w", err)
		}
		if resolved, err := filepath.EvalSymlinks(exe); err == nil {
			exe = resolved
		}
		c.BinDir = filepath.Dir(exe)
	}
	if c.ConfigDir == "" {
		c.ConfigDir = filepath.Join(c.BinDir, "..", "configs")
	}
	if c.Agents == 0 {
		c.Agents = 3
	}
	if c.Pool == "" {
		c.Pool = spec.DefaultPool
	}
	if c.ReadyTimeout <= 0 {
		c.ReadyTimeout = 30 * time.Second
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 15 * time.Second
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	return c, nil
}

// Validate reports a configuration Run cannot use.
func (c Config) Validate() error {
	switch {
	case c.Agents < 1 || c.Agents > 100:
		return fmt.Errorf("agents must be between 1 and 100, got %d", c.Agents)
	case c.Port < -1 || c.Port > 65535:
		return fmt.Errorf("port must be a TCP port or -1, got %d", c.Port)
	case c.MetricsPort < 0 || c.MetricsPort+2+c.Agents > 65535:
		return fmt.Errorf("metrics port %d leaves no room for %d endpoints", c.MetricsPort, c.Agents+2)
	}
	return nil
}

// Env describes the running system to OnReady and to the banner.
type Env struct {
	// URL is the embedded server's client URL.
	URL string
	// DataDir is where JetStream keeps its data.
	DataDir string
	// Processes are the children, in start order.
	Processes []Process
}

// Process describes one child.
type Process struct {
	Name string
	Role string
	Args []string
	// MetricsURL is its /metrics endpoint, empty when none was assigned.
	MetricsURL string
	// ConfigFile is the configuration file Run writes for it (agents).
	ConfigFile string

	agentMetricsAddr string
}

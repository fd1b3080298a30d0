package dev

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Roles, which are also the binaries' names.
const (
	RoleScheduler  = "scheduler"
	RoleSupervisor = "supervisor"
	RoleAgent      = "agent"
)

// ErrMissingBinary: a role's binary is not in BinDir.
var ErrMissingBinary = errors.New("binary not found")

// binaries checks that every role's binary exists and returns their paths.
func binaries(dir string) (map[string]string, error) {
	out := map[string]string{}
	var missing []string
	for _, role := range []string{RoleScheduler, RoleSupervisor, RoleAgent} {
		p := filepath.Join(dir, role)
		if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, role)
			continue
		}
		out[role] = p
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: %s in %s (warden dev runs the binaries next to its own executable; build them with `make build`)",
			ErrMissingBinary, strings.Join(missing, ", "), dir)
	}
	return out, nil
}

// agentCapabilities gives the first agent docker as well as linux, so that
// jobs can require a capability only some agents have.
func agentCapabilities(i int) string {
	if i == 1 {
		return "linux,docker"
	}
	return "linux"
}

// plan lists the children to start. flags reports which optional flags a
// role's binary accepts. Agents get a generated configuration file in
// dataDir (see agentConfig); the scheduler and supervisor get
// configs/<role>.yaml when it exists. Every child is told the deployment's
// task shards and partitions (dep) outright, so that a child's own file or
// environment cannot disagree with the streams Run created.
func plan(c Config, dep deployment, url, dataDir string, flags func(role, flag string) bool) []Process {
	port := c.MetricsPort
	nextMetrics := func() string {
		if c.MetricsPort == 0 {
			return ""
		}
		port++
		return fmt.Sprintf("%s:%d", c.Host, port-1)
	}
	var out []Process
	for _, role := range []string{RoleScheduler, RoleSupervisor} {
		p := Process{Name: role, Role: role, Args: []string{"--server", url}}
		if cfg := filepath.Join(c.ConfigDir, role+".yaml"); fileExists(cfg) && flags(role, "--config") {
			p.Args = append(p.Args, "--config", cfg)
		}
		p.Args = append(p.Args, dep.args(role, flags)...)
		if addr := nextMetrics(); addr != "" && flags(role, "--metrics-addr") {
			p.Args = append(p.Args, "--metrics-addr", addr)
			p.MetricsURL = "http://" + addr + "/metrics"
		}
		out = append(out, p)
	}
	for i := 1; i <= c.Agents; i++ {
		id := fmt.Sprintf("agent-%d", i)
		p := Process{Name: id, Role: RoleAgent,
			Args: []string{"--server", url, "--id", id, "--pool", c.Pool, "--capabilities", agentCapabilities(i)}}
		p.Args = append(p.Args, dep.args(RoleAgent, flags)...)
		addr := nextMetrics()
		if flags(RoleAgent, "--config") {
			p.ConfigFile = filepath.Join(dataDir, "config", id+".yaml")
			p.Args = append(p.Args, "--config", p.ConfigFile)
			if addr != "" {
				p.agentMetricsAddr = addr
				p.MetricsURL = "http://" + addr + "/metrics"
			}
		}
		out = append(out, p)
	}
	return out
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir()
}

// flagProbe asks each binary for its --help once and remembers which flags
// it lists, so that warden dev works with binaries that do not (yet)
// offer an optional flag instead of failing to start them.
func flagProbe(ctx context.Context, bins map[string]string) func(role, flag string) bool {
	help := map[string]string{}
	return func(role, flag string) bool {
		h, ok := help[role]
		if !ok {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			var buf bytes.Buffer
			cmd := exec.CommandContext(pctx, bins[role], "--help")
			cmd.Stdout, cmd.Stderr = &buf, &buf
			_ = cmd.Run() // some flag packages exit non-zero after --help
			h = buf.String()
			help[role] = h
		}
		return helpHasFlag(h, flag)
	}
}

// helpHasFlag reports whether a --help text lists flag, written "--flag"
// (cobra, pflag) or "-flag" (the flag package).
func helpHasFlag(help, flag string) bool {
	name := regexp.QuoteMeta(strings.TrimLeft(flag, "-"))
	return regexp.MustCompile(`(?m)(^|[\s,])--?` + name + `([\s=]|$)`).MatchString(help)
}

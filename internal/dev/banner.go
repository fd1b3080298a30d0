package dev

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/wardenhq/warden/internal/natsconn"
)

// banner tells a new user what is running and what to do next.
func (d *devRun) banner(env Env) {
	warden := wardenCommand()
	lines := []string{
		"",
		"Warden is running. Ctrl-C stops everything.",
		"",
	}
	if env.URL != natsconn.DefaultURL {
		lines = append(lines, "  In another terminal, first:   export NATS_URL="+env.URL)
	}
	lines = append(lines,
		"  Submit a job and follow it:  "+warden+" submit -f examples/deploy.yaml --wait",
		"  Inspect:                     "+warden+" jobs ls | "+warden+" job show <id> | "+warden+" agents ls",
		"  Raw NATS (nats CLI):         nats kv ls warden_jobs | nats stream ls | nats kv watch warden_jobs",
		"  Data:                        "+env.DataDir+" (delete its config/ and jetstream/ to start afresh; never secrets/)",
	)
	var metrics []string
	for _, p := range env.Processes {
		if p.Role == "api" {
			lines = append(lines, "  Dashboard:                   "+dashboardURL(d.cfg.APIAddr))
		}
		if p.MetricsURL != "" {
			metrics = append(metrics, fmt.Sprintf("    %-10s %s", p.Name, p.MetricsURL))
		}
	}
	if len(metrics) > 0 {
		lines = append(lines, "  Metrics (Prometheus):")
		lines = append(lines, metrics...)
	}
	lines = append(lines, "")
	for _, l := range lines {
		d.say("%s", l)
	}
}

// dashboardURL is the base URL of the API listening on addr, where it
// serves the dashboard: a listener on every interface is reached on the
// loopback address.
func dashboardURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr + "/"
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/"
}

// wardenCommand is how to run this warden binary from the current
// directory: bin/warden after `make run`.
func wardenCommand() string {
	exe, err := os.Executable()
	if err != nil {
		return "warden"
	}
	wd, err := os.Getwd()
	if err != nil {
		return exe
	}
	rel, err := filepath.Rel(wd, exe)
	if err != nil || strings.HasPrefix(rel, "..") {
		return exe
	}
	if !strings.Contains(rel, string(filepath.Separator)) {
		return "." + string(filepath.Separator) + rel
	}
	return rel
}

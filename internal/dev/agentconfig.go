package dev

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"gopkg.in/yaml.v3"
)

// Dev agents run more than a production default allows: a sandbox on one's
// own machine should run the examples, and stop quickly on Ctrl-C.
var (
	devActions  = []string{"echo", "sleep", "shell", "http"}
	devCommands = []string{"echo", "uname", "hostname", "date", "sleep", "true", "false"}
)

// devDrainTimeout is below Config.ShutdownTimeout's default, so that an
// agent hands back its tasks itself before it could be killed.
const devDrainTimeout = "10s"

// agentConfig renders one dev agent's configuration: base (the contents of
// configs/agent.yaml, or nil) with the dev additions, so that whatever the
// user set there still applies.
func agentConfig(base []byte, metricsAddr string) ([]byte, error) {
	doc := map[string]any{}
	if len(bytes.TrimSpace(base)) > 0 {
		if err := yaml.Unmarshal(base, &doc); err != nil {
			return nil, fmt.Errorf("agent config: %w", err)
		}
	}
	doc["actions"] = union(stringList(doc["actions"]), devActions)
	shell, _ := doc["shell"].(map[string]any)
	if shell == nil {
		shell = map[string]any{}
	}
	shell["allowed_commands"] = union(stringList(shell["allowed_commands"]), devCommands)
	doc["shell"] = shell
	doc["drain_timeout"] = devDrainTimeout
	if metricsAddr != "" {
		doc["metrics_addr"] = metricsAddr
	}
	body, err := yaml.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	header := "# Written by `warden dev` at every start: configs/agent.yaml plus what a\n" +
		"# local sandbox needs (the shell and http actions, a few harmless commands,\n" +
		"# a short drain). Edit configs/agent.yaml instead.\n"
	return append([]byte(header), body...), nil
}

// writeAgentConfigs writes the config file of every agent in procs.
func writeAgentConfigs(baseFile string, procs []Process) error {
	base, err := os.ReadFile(baseFile)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("read %s: %w", baseFile, err)
	}
	for _, p := range procs {
		if p.ConfigFile == "" {
			continue
		}
		body, err := agentConfig(base, p.agentMetricsAddr)
		if err != nil {
			return fmt.Errorf("%s: %w", baseFile, err)
		}
		if err := os.MkdirAll(filepath.Dir(p.ConfigFile), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p.ConfigFile, body, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func stringList(v any) []string {
	l, _ := v.([]any)
	var out []string
	for _, x := range l {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, s := range b {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

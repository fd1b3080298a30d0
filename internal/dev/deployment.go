package dev

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"gopkg.in/yaml.v3"

	"github.com/wardenhq/warden/streams"
)

// deployment is what every process of a deployment must agree on: the
// streams Run creates are made with it, and every child is told it.
type deployment struct {
	TaskShards int `yaml:"task_shards"`
	Partitions int `yaml:"partitions"`
}

// deploymentOf resolves the deployment: Config.TaskShards (--task-shards)
// over ConfigDir/scheduler.yaml over the streams package's defaults. The
// scheduler's file is the one a user edits to resize; reading it here keeps
// `make run` from creating streams the scheduler then refuses.
func deploymentOf(c Config) (deployment, error) {
	var d deployment
	path := filepath.Join(c.ConfigDir, RoleScheduler+".yaml")
	if body, err := os.ReadFile(path); err == nil {
		// Not strict: the file has every scheduler setting; only these two
		// matter here, and the scheduler itself rejects what is wrong.
		if err := yaml.Unmarshal(body, &d); err != nil {
			return d, fmt.Errorf("%s: %w", path, err)
		}
	} else if !os.IsNotExist(err) {
		return d, fmt.Errorf("read %s: %w", path, err)
	}
	if c.TaskShards > 0 {
		d.TaskShards = c.TaskShards
	}
	if d.TaskShards <= 0 {
		d.TaskShards = streams.DefaultTaskShards
	}
	if d.Partitions <= 0 {
		d.Partitions = streams.DefaultPartitions
	}
	return d, nil
}

// args are the flags that tell a child of role the deployment, for the
// flags its binary offers.
func (d deployment) args(role string, flags func(role, flag string) bool) []string {
	var out []string
	if flags(role, "--task-shards") {
		out = append(out, "--task-shards", strconv.Itoa(d.TaskShards))
	}
	if role != RoleAgent && flags(role, "--partitions") {
		out = append(out, "--partitions", strconv.Itoa(d.Partitions))
	}
	return out
}

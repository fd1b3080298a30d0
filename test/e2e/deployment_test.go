package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/test/procs"
)

// Processes configured with other task_shards or partitions than the
// deployment's refuse to start, naming both values (the deployment record
// was written by newEnv's streams.Ensure: task_shards 4, partitions 8).
func TestDeploymentMismatchIsRefusedAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"supervisor", []string{"--task-shards", "2"}, []string{"task_shards=2", "task_shards=4"}},
		{"scheduler", []string{"--partitions", "16"}, []string{"partitions=16", "partitions=8"}},
		{"agent", []string{"--task-shards", "3", "--id", "odd"}, []string{"task_shards=3", "task_shards=4"}},
	} {
		p := procs.Start(t, c.name, bins[c.name], append([]string{"--server", e.srv.URL}, c.args...)...)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		code, err := p.Wait(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", c.name, c.args, err, p.Output())
		}
		out := p.Output()
		if code != 1 {
			t.Errorf("%s %v exited %d, want 1:\n%s", c.name, c.args, code, out)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s %v: output does not name %q:\n%s", c.name, c.args, w, out)
			}
		}
	}
}

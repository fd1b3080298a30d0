package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
)

const clusterYAML = `agent_cluster:
  name: prod-docker
  target_group: {name: prod-docker-hosts, targets: [h1, h2, h3]}
  membership: {minimum_agents: 1, desired_agents: 2, max_agents: 3, failure_threshold: 1s}
  replication_mode: active_passive
  failover: {selection_strategy: standby, task_transfer_timeout: 5m, max_transfer_retries: 3}
  leader_election: {lease_duration: 1s}
  state_sync: {interval: 300ms}
  config: {image: v1}
`

// startMembers runs cluster members p.<id> in process until the test ends.
func startMembers(t *testing.T, e env, name string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		m, err := cluster.NewMember(context.Background(), e.js, cluster.MemberConfig{Cluster: name, Pool: "p", ID: id,
			Interval: 200 * time.Millisecond, Stagger: 100 * time.Millisecond, StartedAt: time.Now(), Logger: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = m.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
}

func TestClusterCommands(t *testing.T) {
	t.Parallel()
	e := setup(t)
	w := func(stdin string, args ...string) result {
		return warden(t, stdin, append([]string{"--server", e.url}, args...)...)
	}
	r := w(clusterYAML, "cluster", "create", "-f", "-")
	if r.code != 0 || !strings.Contains(r.stdout, "cluster prod-docker created (active_passive, 3 targets") {
		t.Fatalf("create: %+v", r)
	}
	if r := w(clusterYAML, "cluster", "create", "-f", "-"); r.code != exitUsage {
		t.Fatalf("second create: %+v", r)
	}
	if r := w("name: x\nreplication_mode: bogus\n", "cluster", "create", "-f", "-"); r.code != exitUsage || !strings.Contains(r.stderr, "replication_mode") {
		t.Fatalf("invalid create: %+v", r)
	}
	if r := w("", "cluster", "show", "nope"); r.code != exitNotFound {
		t.Fatalf("show unknown: %+v", r)
	}
	// No member reports yet: an empty list, as every --json list is
	// (it printed null).
	if r := w("", "--json", "cluster", "members", "prod-docker"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("members of a cluster with none: %+v, want []", r)
	}

	// Two members, in process.
	startMembers(t, e, "prod-docker", "a", "b")
	var st protocol.ClusterState
	natstest.Eventually(t, 10*time.Second, "leader and standby", func() bool {
		r := w("", "--json", "cluster", "show", "prod-docker")
		var v clusterView
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil || v.State == nil {
			return false
		}
		st = *v.State
		return strings.Contains(r.stdout, `"role": "standby"`) && len(v.OutOfSync) == 0 && len(v.Reports) == 2
	})
	r = w("", "cluster", "show", "prod-docker")
	t.Logf("warden cluster show prod-docker:\n%s", r.stdout)
	if !strings.Contains(r.stdout, "Leader:       "+st.Leader) || !strings.Contains(r.stdout, "in sync") {
		t.Fatalf("show: %+v", r)
	}
	r = w("", "cluster", "ls")
	t.Logf("warden cluster ls:\n%s", r.stdout)
	if r.code != 0 || !strings.Contains(r.stdout, "prod-docker") || !strings.Contains(r.stdout, "2/2 (min 1)") {
		t.Fatalf("ls: %+v", r)
	}

	to := "p.a"
	if st.Leader == to {
		to = "p.b"
	}
	r = w("", "cluster", "failover", "prod-docker", "--to", to, "--reason", "maintenance")
	if r.code != 0 {
		t.Fatalf("failover: %+v", r)
	}
	var fo string
	natstest.Eventually(t, 10*time.Second, "failover in history", func() bool {
		r := w("", "failovers", "ls", "--cluster", "prod-docker")
		if !strings.Contains(r.stdout, "manual failover") {
			return false
		}
		t.Logf("warden failovers ls:\n%s", r.stdout)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		fo = strings.Fields(lines[len(lines)-1])[0]
		return true
	})
	r = w("", "failovers", "show", fo)
	t.Logf("warden failovers show %s:\n%s", fo, r.stdout)
	if r.code != 0 || !strings.Contains(r.stdout, "to:       "+to) {
		t.Fatalf("failovers show: %+v", r)
	}
	if r := w("", "failovers", "show", "nope"); r.code != exitNotFound {
		t.Fatalf("failovers show unknown: %+v", r)
	}

	// An update (new config) reaches the members; they stay in sync.
	r = w(strings.Replace(clusterYAML, "image: v1", "image: v2", 1), "cluster", "update", "-f", "-")
	if r.code != 0 {
		t.Fatalf("update: %+v", r)
	}
	natstest.Eventually(t, 10*time.Second, "members in sync after the update", func() bool {
		r := w("", "cluster", "members", "prod-docker")
		return strings.Count(r.stdout, "in sync") == 2
	})
	if r := w("", "cluster", "rebalance", "prod-docker"); r.code != 0 {
		t.Fatalf("rebalance: %+v", r)
	}
	// With --json, stdout is one JSON document (it was the human line).
	if r := w("", "--json", "cluster", "delete", "prod-docker"); r.code != 0 || !json.Valid([]byte(r.stdout)) || !strings.Contains(r.stdout, `"deleted"`) {
		t.Fatalf("delete: %+v", r)
	}
	if r := w("", "cluster", "show", "prod-docker"); r.code != exitNotFound {
		t.Fatalf("show after delete: %+v", r)
	}
	evs := w("", "--json", "cluster", "ls")
	if strings.TrimSpace(evs.stdout) != "[]" {
		t.Fatalf("ls after delete: %q", evs.stdout)
	}
}

// cluster failover --to a member that cannot take over (a typo) is refused
// by the leader, which keeps leading; the CLI printed that the failover
// was "handled" and exited 0. It says the leader refused it and why, and
// exits 2 (with --json: code "rejected" on stderr).
func TestClusterFailoverRefusedExits2(t *testing.T) {
	t.Parallel()
	e := setup(t)
	w := func(args ...string) result {
		return warden(t, clusterYAML, append([]string{"--server", e.url}, args...)...)
	}
	if r := w("cluster", "create", "-f", "-"); r.code != exitOK {
		t.Fatalf("create: %+v", r)
	}
	startMembers(t, e, "prod-docker", "a")
	leader := func() string {
		r := w("--json", "cluster", "show", "prod-docker")
		var v clusterView
		if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &v) != nil || v.State == nil {
			return ""
		}
		return v.State.Leader
	}
	natstest.Eventually(t, 10*time.Second, "p.a leads", func() bool { return leader() == "p.a" })

	r := w("cluster", "failover", "prod-docker", "--to", "p.typo")
	t.Logf("warden cluster failover prod-docker --to p.typo: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	if r.code != exitUsage || !strings.Contains(r.stderr, "refused") || !strings.Contains(r.stderr, "p.typo: not a member of the cluster") ||
		strings.Contains(r.stdout, "handled") {
		t.Errorf("refused failover: exit %d, stdout %q, stderr %q; want exit %d naming the refusal", r.code, r.stdout, r.stderr, exitUsage)
	}

	r = w("--json", "cluster", "failover", "prod-docker", "--to", "p.typo")
	var fail jsonError
	if err := json.Unmarshal([]byte(r.stderr), &fail); err != nil || r.code != exitUsage || fail.Code != "rejected" || fail.ExitCode != exitUsage ||
		!strings.Contains(fail.Error, "not a member") || r.stdout != "" {
		t.Errorf("refused failover --json: exit %d, stdout %q, stderr %q (%v)", r.code, r.stdout, r.stderr, err)
	}
	// Without --to, and no other member to take over.
	r = w("cluster", "failover", "prod-docker")
	if r.code != exitUsage || !strings.Contains(r.stderr, "no standby can take over") {
		t.Errorf("failover with no standby: exit %d, stdout %q, stderr %q; want exit %d naming the refusal", r.code, r.stdout, r.stderr, exitUsage)
	}
	if l := leader(); l != "p.a" {
		t.Errorf("leader after refused failovers: %q, want p.a", l)
	}
}

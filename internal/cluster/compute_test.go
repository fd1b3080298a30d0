package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func def(mode string, min, desired, max int, tg ...string) protocol.ClusterDefinition {
	return WithDefaults(protocol.ClusterDefinition{
		Name: "prod", Mode: mode, TargetGroup: protocol.TargetGroup{Name: "hosts", Targets: tg},
		Membership: protocol.ClusterMembership{Minimum: min, Desired: desired, Maximum: max},
	})
}

// members builds observations: "a" alive, "-a" silent, "a!" failed health, "a~" draining.
func members(specs ...string) map[string]Observed {
	out := map[string]Observed{}
	for i, s := range specs {
		alive := !strings.HasPrefix(s, "-")
		s = strings.TrimPrefix(s, "-")
		r := protocol.ClusterMemberReport{Cluster: "prod", Pool: "p", MaxConcurrent: 4, StartedAt: t0.Add(time.Duration(i) * time.Second)}
		switch {
		case strings.HasSuffix(s, "!"):
			r.Health, s = "failed", strings.TrimSuffix(s, "!")
		case strings.HasSuffix(s, "~"):
			r.Draining, s = true, strings.TrimSuffix(s, "~")
		}
		r.ID = s
		out[r.Key()] = Observed{Report: r, Alive: alive}
	}
	return out
}

func roles(s protocol.ClusterState) string {
	var b []string
	for _, m := range s.Members {
		b = append(b, strings.TrimPrefix(m.Key, "p.")+"="+m.Role)
	}
	return strings.Join(b, " ")
}

func kinds(evs []protocol.Event) string {
	var b []string
	for _, e := range evs {
		b = append(b, string(e.Kind))
	}
	return strings.Join(b, ",")
}

func TestActivePassiveLeaderAndStandbys(t *testing.T) {
	t.Parallel()
	d := def(protocol.ModeActivePassive, 2, 3, 0)
	s, evs := Compute(Input{Def: d, Members: members("a", "b", "c"), Leader: "p.a", LeaseEpoch: 7, Now: t0})
	if roles(s) != "a=leader b=standby c=standby" || s.Epoch != 7 || s.Status != protocol.ClusterHealthy {
		t.Fatalf("state %s epoch %d status %s", roles(s), s.Epoch, s.Status)
	}
	if !strings.Contains(kinds(evs), string(protocol.EventClusterLeader)) {
		t.Errorf("no leader event: %s", kinds(evs))
	}
	// a dies; b wins the lease with a higher revision.
	s2, evs := Compute(Input{Def: d, Prev: s, Members: members("-a", "b", "c"), Leader: "p.b", LeaseEpoch: 12, Now: t0})
	if roles(s2) != "a=offline b=leader c=standby" || s2.Epoch != 12 || s2.Status != protocol.ClusterDegraded {
		t.Fatalf("after failover: %s epoch %d status %s", roles(s2), s2.Epoch, s2.Status)
	}
	var fo *protocol.Event
	for i := range evs {
		if evs[i].Kind == protocol.EventClusterFailover {
			fo = &evs[i]
		}
	}
	if fo == nil || fo.Data["from"] != "p.a" || fo.Data["to"] != "p.b" || fo.Reason != "not reporting" {
		t.Fatalf("failover event %+v in %s", fo, kinds(evs))
	}
	// a comes back: a standby, never a second leader.
	s3, _ := Compute(Input{Def: d, Prev: s2, Members: members("a", "b", "c"), Leader: "p.b", LeaseEpoch: 12, Now: t0})
	if roles(s3) != "a=standby b=leader c=standby" || s3.Epoch != 12 {
		t.Fatalf("after return: %s epoch %d", roles(s3), s3.Epoch)
	}
}

func TestOverMaximumIsRefusedWithAnEvent(t *testing.T) {
	t.Parallel()
	d := def(protocol.ModeActiveActive, 1, 2, 2)
	s, _ := Compute(Input{Def: d, Members: members("a", "b"), Leader: "p.a", LeaseEpoch: 3, Now: t0})
	// c started last: refused, even though its key sorts first among newcomers.
	s2, evs := Compute(Input{Def: d, Prev: s, Members: members("a", "b", "c"), Leader: "p.a", LeaseEpoch: 3, Now: t0})
	if roles(s2) != "a=member b=member c=refused" {
		t.Fatalf("roles %s", roles(s2))
	}
	if kinds(evs) != string(protocol.EventClusterMemberRefused) {
		t.Fatalf("events %s", kinds(evs))
	}
	if !strings.Contains(evs[0].Reason, "max_agents=2") {
		t.Errorf("reason %q", evs[0].Reason)
	}
	// The same state again raises nothing.
	s3, evs := Compute(Input{Def: d, Prev: s2, Members: members("a", "b", "c"), Leader: "p.a", LeaseEpoch: 3, Now: t0})
	if len(evs) != 0 || !Same(s2, s3) {
		t.Fatalf("repeat: %s", kinds(evs))
	}
	// b leaves: c is admitted in its place.
	s4, _ := Compute(Input{Def: d, Prev: s3, Members: members("a", "-b", "c"), Leader: "p.a", LeaseEpoch: 3, Now: t0})
	if roles(s4) != "a=member b=offline c=member" {
		t.Fatalf("roles %s", roles(s4))
	}
}

func TestUnderReplicatedRaisesEventAndHealing(t *testing.T) {
	t.Parallel()
	d := def(protocol.ModeActiveActive, 2, 3, 0)
	s, _ := Compute(Input{Def: d, Members: members("a", "b", "c"), Leader: "p.a", LeaseEpoch: 3, Now: t0})
	s2, evs := Compute(Input{Def: d, Prev: s, Members: members("a", "b!", "c~"), Leader: "p.a", LeaseEpoch: 3, Now: t0})
	if s2.Status != protocol.ClusterUnderReplicated || s2.Healthy != 1 {
		t.Fatalf("status %s healthy %d", s2.Status, s2.Healthy)
	}
	k := kinds(evs)
	for _, want := range []protocol.EventKind{protocol.EventClusterUnderReplicated, "healing", protocol.EventClusterFailover, protocol.EventClusterMemberLeft} {
		if !strings.Contains(k, string(want)) {
			t.Errorf("no %s in %s", want, k)
		}
	}
	s3, evs := Compute(Input{Def: d, Prev: s2, Members: members("a", "b", "c"), Leader: "p.a", LeaseEpoch: 3, Now: t0})
	if s3.Status != protocol.ClusterHealthy || !strings.Contains(kinds(evs), string(protocol.EventClusterRecovered)) {
		t.Fatalf("status %s events %s", s3.Status, kinds(evs))
	}
}

func TestHealingReadmitsExcludedMembers(t *testing.T) {
	t.Parallel()
	d := def(protocol.ModeActiveActive, 2, 2, 0)
	s, _ := Compute(Input{Def: d, Members: members("a", "b", "c"), Leader: "p.a", LeaseEpoch: 3, Exclude: []string{"p.b"}, Now: t0})
	if roles(s) != "a=member b=excluded c=member" {
		t.Fatalf("roles %s", roles(s))
	}
	// c dies: with b excluded only a is left, below minimum: b comes back.
	s2, evs := Compute(Input{Def: d, Prev: s, Members: members("a", "b", "-c"), Leader: "p.a", LeaseEpoch: 3, Now: t0})
	if roles(s2) != "a=member b=member c=offline" || s2.Status != protocol.ClusterHealthy {
		t.Fatalf("roles %s status %s", roles(s2), s2.Status)
	}
	if !strings.Contains(kinds(evs), "healing") {
		t.Errorf("events %s", kinds(evs))
	}
}

func TestShardedFailoverAndRebalance(t *testing.T) {
	t.Parallel()
	tg := targets(60)
	d := def(protocol.ModeSharded, 1, 3, 0, tg...)
	d.Sharding.Rebalance = protocol.RebalanceManual
	s, _ := Compute(Input{Def: d, Members: members("a", "b", "c"), Leader: "p.a", LeaseEpoch: 5, Now: t0})
	if fmt.Sprint(s.Owners) != "[p.a p.b p.c]" || s.Epoch != 5 {
		t.Fatalf("owners %v epoch %d", s.Owners, s.Epoch)
	}
	checkOneOwner(t, s, tg)
	// c is killed: its shards go to a and b, under a new epoch.
	s2, evs := Compute(Input{Def: d, Prev: s, Members: members("a", "b", "-c"), Leader: "p.a", LeaseEpoch: 5, Now: t0})
	if fmt.Sprint(s2.Owners) != "[p.a p.b]" || s2.Epoch != 6 {
		t.Fatalf("owners %v epoch %d", s2.Owners, s2.Epoch)
	}
	checkOneOwner(t, s2, tg)
	if !strings.Contains(kinds(evs), string(protocol.EventClusterFailover)) {
		t.Fatalf("events %s", kinds(evs))
	}
	// Only c's targets moved.
	cOwned := setOf(mustMember(t, s, "p.c").Targets)
	for _, m := range []string{"p.a", "p.b"} {
		for _, tgt := range mustMember(t, s, m).Targets {
			if Owner(tgt, s2.Owners) != m {
				t.Fatalf("%s moved away from surviving %s", tgt, m)
			}
		}
	}
	// c returns: a standby until rebalance (manual policy); epoch unchanged.
	s3, _ := Compute(Input{Def: d, Prev: s2, Members: members("a", "b", "c"), Leader: "p.a", LeaseEpoch: 5, Now: t0})
	if roles(s3) != "a=member b=member c=standby" || s3.Epoch != 6 {
		t.Fatalf("roles %s epoch %d", roles(s3), s3.Epoch)
	}
	// Rebalance: c gets exactly its shards back.
	s4, evs := Compute(Input{Def: d, Prev: s3, Members: members("a", "b", "c"), Leader: "p.a", LeaseEpoch: 5, Rebalance: true, Now: t0})
	if s4.Epoch != 7 || !strings.Contains(kinds(evs), string(protocol.EventClusterRebalanced)) {
		t.Fatalf("epoch %d events %s", s4.Epoch, kinds(evs))
	}
	back := setOf(mustMember(t, s4, "p.c").Targets)
	if fmt.Sprint(back) != fmt.Sprint(cOwned) {
		t.Fatalf("c got %v back, owned %v", back, cOwned)
	}
	checkOneOwner(t, s4, tg)
}

func TestShardedAutoRebalanceOnJoin(t *testing.T) {
	t.Parallel()
	d := def(protocol.ModeSharded, 1, 2, 0, targets(20)...)
	s, _ := Compute(Input{Def: d, Members: members("a"), Leader: "p.a", LeaseEpoch: 5, Now: t0})
	s2, _ := Compute(Input{Def: d, Prev: s, Members: members("a", "b"), Leader: "p.a", LeaseEpoch: 5, Now: t0})
	if fmt.Sprint(s2.Owners) != "[p.a p.b]" || s2.Epoch != 6 {
		t.Fatalf("owners %v epoch %d", s2.Owners, s2.Epoch)
	}
	// A new leader with a higher lease never lowers the epoch.
	s3, _ := Compute(Input{Def: d, Prev: s2, Members: members("-a", "b"), Leader: "p.b", LeaseEpoch: 40, Now: t0})
	if s3.Epoch != 40 {
		t.Fatalf("epoch %d", s3.Epoch)
	}
}

func mustMember(t *testing.T, s protocol.ClusterState, k string) protocol.ClusterMember {
	t.Helper()
	m, ok := s.Member(k)
	if !ok {
		t.Fatalf("no member %s", k)
	}
	return m
}

func checkOneOwner(t *testing.T, s protocol.ClusterState, tg []string) {
	t.Helper()
	owner := map[string]string{}
	for _, m := range s.Members {
		for _, x := range m.Targets {
			if o, ok := owner[x]; ok {
				t.Fatalf("epoch %d: %s owned by %s and %s", s.Epoch, x, o, m.Key)
			}
			owner[x] = m.Key
		}
	}
	if len(owner) != len(tg) {
		t.Fatalf("epoch %d: %d of %d targets owned", s.Epoch, len(owner), len(tg))
	}
}

func TestDefinitionParse(t *testing.T) {
	t.Parallel()
	d, err := Parse([]byte(`agent_cluster:
  name: prod-docker
  target_group: {name: prod-docker-hosts, targets: [h1, h2]}
  membership: {minimum_agents: 2, desired_agents: 3, max_agents: 5}
  replication_mode: active_active
  failover: {selection_strategy: least_loaded, task_transfer_timeout: 5m, max_transfer_retries: 3}
  leader_election: {lease_duration: 30s}
`))
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "prod-docker" || d.Membership.Maximum != 5 || d.Election.LeaseDuration.Std() != 30*time.Second || d.StateSync.Interval.Std() != DefaultSyncInterval {
		t.Fatalf("%+v", d)
	}
	if _, err := Parse([]byte(`{"name":"x","replication_mode":"sharded"}`)); err != nil {
		t.Fatalf("bare JSON: %v", err)
	}
	_, err = Parse([]byte("name: bad name\nreplication_mode: other\nmembership: {minimum_agents: 3, desired_agents: 2}\n"))
	for _, want := range []string{"name", "replication_mode", "desired_agents (2) must be at least minimum_agents (3)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
	if _, err := Parse([]byte("name: x\nreplication_mode: sharded\nbogus: 1\n")); err == nil {
		t.Error("unknown field accepted")
	}
}

// Epochs never decrease, across mode changes too: the sharded counter can
// run past the leader's lease revision, and switching to active_passive
// must not go back to that revision.
func TestModeChangeNeverLowersEpoch(t *testing.T) {
	t.Parallel()
	d := def(protocol.ModeSharded, 1, 3, 0, targets(10)...)
	s, _ := Compute(Input{Def: d, Members: members("a", "b", "c"), Leader: "p.a", LeaseEpoch: 5, Now: t0})
	s, _ = Compute(Input{Def: d, Prev: s, Members: members("a", "b", "-c"), Leader: "p.a", LeaseEpoch: 5, Now: t0})
	s, _ = Compute(Input{Def: d, Prev: s, Members: members("a", "-b", "-c"), Leader: "p.a", LeaseEpoch: 5, Now: t0})
	if s.Epoch != 7 {
		t.Fatalf("sharded epoch %d, want 7", s.Epoch)
	}
	d.Mode = protocol.ModeActivePassive
	ap, _ := Compute(Input{Def: d, Prev: s, Members: members("a", "-b", "-c"), Leader: "p.a", LeaseEpoch: 5, Now: t0})
	if ap.Epoch <= s.Epoch {
		t.Fatalf("sharded -> active_passive lowered the epoch: %d -> %d", s.Epoch, ap.Epoch)
	}
	// The rest of the term keeps it.
	again, _ := Compute(Input{Def: d, Prev: ap, Members: members("a", "b", "-c"), Leader: "p.a", LeaseEpoch: 5, Now: t0})
	if again.Epoch != ap.Epoch {
		t.Fatalf("same term, epoch %d -> %d", ap.Epoch, again.Epoch)
	}
	// A new term with a lease below it still goes up; one above takes the lease.
	b1, _ := Compute(Input{Def: d, Prev: again, Members: members("-a", "b", "-c"), Leader: "p.b", LeaseEpoch: 6, Now: t0})
	if b1.Epoch != again.Epoch+1 {
		t.Fatalf("new term with lease 6 after epoch %d: %d", again.Epoch, b1.Epoch)
	}
	c1, _ := Compute(Input{Def: d, Prev: b1, Members: members("-a", "-b", "c"), Leader: "p.c", LeaseEpoch: 40, Now: t0})
	if c1.Epoch != 40 {
		t.Fatalf("new term with lease 40: epoch %d", c1.Epoch)
	}
}

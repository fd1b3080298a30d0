package cluster_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

type bundle struct {
	srv   *natstest.Server
	js    jetstream.JetStream
	store *cluster.Store
}

func setup(t *testing.T) *bundle {
	t.Helper()
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{})
	st, err := cluster.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{srv: srv, js: js, store: st}
}

func (b *bundle) define(t *testing.T, d protocol.ClusterDefinition) {
	t.Helper()
	d.Membership.FailureThreshold = protocol.Duration(time.Second)
	d.Election.LeaseDuration = protocol.Duration(time.Second)
	d.StateSync.Interval = protocol.Duration(300 * time.Millisecond)
	if _, err := b.store.Create(context.Background(), d); err != nil {
		t.Fatal(err)
	}
}

// agent is one member with its own connection, so that closing the
// connection is a crash: nothing is released.
type agent struct {
	m      *cluster.Member
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
	load   atomic.Int32
}

func (b *bundle) start(t *testing.T, clusterName, id string) *agent {
	t.Helper()
	nc, js := b.srv.Connect(t)
	a := &agent{nc: nc, done: make(chan struct{})}
	m, err := cluster.NewMember(context.Background(), js, cluster.MemberConfig{
		Cluster: clusterName, Pool: "p", ID: id, Interval: 200 * time.Millisecond, Stagger: 100 * time.Millisecond,
		StartedAt: time.Now(), Load: func() (int, int) { return int(a.load.Load()), 4 }, Logger: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	a.m = m
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go func() { defer close(a.done); _ = m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-a.done })
	return a
}

// crash cuts the member off without a goodbye.
func (a *agent) crash() {
	a.nc.Close()
	a.cancel()
	<-a.done
}

func (b *bundle) state(t *testing.T, name string) protocol.ClusterState {
	t.Helper()
	st, _, _ := b.store.State(context.Background(), name)
	return st
}

func roles(st protocol.ClusterState) string {
	var out []string
	for _, m := range st.Members {
		out = append(out, strings.TrimPrefix(m.Key, "p.")+"="+m.Role)
	}
	return strings.Join(out, " ")
}

func eventsOf(t *testing.T, js jetstream.JetStream, kind protocol.EventKind) []protocol.Event {
	t.Helper()
	evs, err := events.List(context.Background(), js, kind, 0)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func TestActivePassiveFailoverAndReturnAsStandby(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.define(t, protocol.ClusterDefinition{Name: "ap", Mode: protocol.ModeActivePassive, TargetGroup: protocol.TargetGroup{Targets: []string{"h1", "h2"}},
		Membership: protocol.ClusterMembership{Minimum: 1, Desired: 3}})
	ag := map[string]*agent{}
	for _, id := range []string{"a", "b", "c"} {
		ag[id] = b.start(t, "ap", id)
	}
	var first protocol.ClusterState
	natstest.Eventually(t, 10*time.Second, "one leader, two standbys", func() bool {
		first = b.state(t, "ap")
		return strings.Count(roles(first), "=leader") == 1 && strings.Count(roles(first), "=standby") == 2
	})
	leaderID := strings.TrimPrefix(first.Leader, "p.")
	t.Logf("leader %s epoch %d: %s", first.Leader, first.Epoch, roles(first))
	if !ag[leaderID].m.View().IsLeader {
		t.Fatal("the state's leader does not know it leads")
	}
	for id, a := range ag {
		if id != leaderID && a.m.View().IsLeader {
			t.Fatalf("%s also believes it leads", id)
		}
	}

	killed := time.Now()
	ag[leaderID].crash()
	var second protocol.ClusterState
	natstest.Eventually(t, 10*time.Second, "a standby takes over", func() bool {
		second = b.state(t, "ap")
		return second.Leader != first.Leader && second.Leader != ""
	})
	took := time.Since(killed)
	t.Logf("failover to %s in %s, epoch %d -> %d: %s", second.Leader, took.Round(time.Millisecond), first.Epoch, second.Epoch, roles(second))
	if second.Epoch <= first.Epoch {
		t.Fatalf("epoch did not grow: %d -> %d", first.Epoch, second.Epoch)
	}
	natstest.Eventually(t, 5*time.Second, "failover event", func() bool {
		for _, e := range eventsOf(t, b.js, protocol.EventClusterFailover) {
			if e.Data["from"] == first.Leader && e.Data["to"] == second.Leader {
				return true
			}
		}
		return false
	})

	// The old leader restarts: a standby, never a second leader.
	back := b.start(t, "ap", leaderID)
	natstest.Eventually(t, 10*time.Second, "restarted agent is a standby", func() bool {
		m, ok := b.state(t, "ap").Member(first.Leader)
		return ok && m.Role == protocol.RoleStandby
	})
	if back.m.View().IsLeader || b.state(t, "ap").Leader != second.Leader {
		t.Fatal("the restarted agent took leadership")
	}
}

func TestActivePassiveManualFailover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.define(t, protocol.ClusterDefinition{Name: "mf", Mode: protocol.ModeActivePassive})
	for _, id := range []string{"a", "b", "c"} {
		b.start(t, "mf", id)
	}
	var first protocol.ClusterState
	natstest.Eventually(t, 10*time.Second, "leader", func() bool {
		first = b.state(t, "mf")
		return strings.Count(roles(first), "=standby") == 2
	})
	to := "p.a"
	if first.Leader == to {
		to = "p.b"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := b.store.Request(ctx, "mf", protocol.ClusterRequest{Op: protocol.RequestFailover, To: to, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.WaitHandled(ctx, "mf", id); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, "handed off to "+to, func() bool { return b.state(t, "mf").Leader == to })
	st := b.state(t, "mf")
	if m, _ := st.Member(first.Leader); m.Role != protocol.RoleStandby {
		t.Fatalf("old leader is %s", m.Role)
	}
	natstest.Eventually(t, 5*time.Second, "manual failover event", func() bool {
		for _, e := range eventsOf(t, b.js, protocol.EventClusterFailover) {
			if e.Reason == "manual failover" && e.Data["to"] == to {
				return true
			}
		}
		return false
	})
}

func TestShardedFailoverMovesOnlyTheDeadMembersShards(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var tg []string
	for i := range 30 {
		tg = append(tg, fmt.Sprintf("host-%02d", i))
	}
	b.define(t, protocol.ClusterDefinition{Name: "sh", Mode: protocol.ModeSharded, TargetGroup: protocol.TargetGroup{Name: "hosts", Targets: tg},
		Membership: protocol.ClusterMembership{Minimum: 2, Desired: 3}})
	ag := map[string]*agent{}
	for _, id := range []string{"a", "b", "c"} {
		ag[id] = b.start(t, "sh", id)
	}
	var first protocol.ClusterState
	natstest.Eventually(t, 10*time.Second, "three shard owners", func() bool {
		first = b.state(t, "sh")
		return len(first.Owners) == 3
	})
	checkOwners(t, first, tg)
	// Every member's own view agrees with the state.
	natstest.Eventually(t, 5*time.Second, "members see their shards", func() bool {
		for id, a := range ag {
			m, _ := first.Member("p." + id)
			if fmt.Sprint(a.m.View().Targets) != fmt.Sprint(m.Targets) {
				return false
			}
		}
		return true
	})
	victim := "c"
	if first.Leader == "p.c" {
		victim = "b"
	}
	victimShards, _ := first.Member("p." + victim)
	ag[victim].crash()
	var second protocol.ClusterState
	natstest.Eventually(t, 10*time.Second, "shards moved to survivors", func() bool {
		second = b.state(t, "sh")
		return len(second.Owners) == 2
	})
	t.Logf("epoch %d -> %d; %s owned %v", first.Epoch, second.Epoch, victim, victimShards.Targets)
	if second.Epoch <= first.Epoch {
		t.Fatal("epoch did not grow")
	}
	checkOwners(t, second, tg)
	for _, m := range first.Members {
		if m.Key == "p."+victim {
			continue
		}
		now, _ := second.Member(m.Key)
		for _, x := range m.Targets {
			if !strings.Contains(fmt.Sprint(now.Targets), x) {
				t.Fatalf("%s moved away from surviving %s", x, m.Key)
			}
		}
	}
	// The survivors refuse nothing of theirs and the dead member's shards
	// are accepted by their new owner only.
	for _, x := range victimShards.Targets {
		d, err := cluster.RouteIn(second, x)
		if err != nil || d.Agent == "p."+victim {
			t.Fatalf("route %s: %v %v", x, d, err)
		}
		id := strings.TrimPrefix(d.Agent, "p.")
		natstest.Eventually(t, 5*time.Second, "new owner accepts "+x, func() bool { return ag[id].m.Accept(second.Epoch, x) == nil })
	}
	// It comes back and gets its shards back (auto rebalance).
	b.start(t, "sh", victim)
	natstest.Eventually(t, 10*time.Second, "shards back", func() bool {
		m, _ := b.state(t, "sh").Member("p." + victim)
		return fmt.Sprint(m.Targets) == fmt.Sprint(victimShards.Targets)
	})
	checkOwners(t, b.state(t, "sh"), tg)
}

func checkOwners(t *testing.T, st protocol.ClusterState, tg []string) {
	t.Helper()
	owner := map[string]string{}
	for _, m := range st.Members {
		for _, x := range m.Targets {
			if o, dup := owner[x]; dup {
				t.Fatalf("epoch %d: %s owned by %s and %s", st.Epoch, x, o, m.Key)
			}
			owner[x] = m.Key
		}
	}
	if len(owner) != len(tg) {
		t.Fatalf("epoch %d: %d of %d targets owned", st.Epoch, len(owner), len(tg))
	}
}

func TestOverMaximumRefusedAndUnderReplicatedRaised(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.define(t, protocol.ClusterDefinition{Name: "aa", Mode: protocol.ModeActiveActive,
		Membership: protocol.ClusterMembership{Minimum: 2, Desired: 2, Maximum: 2}})
	x := b.start(t, "aa", "a")
	natstest.Eventually(t, 10*time.Second, "under-replicated with one member", func() bool {
		return b.state(t, "aa").Status == protocol.ClusterUnderReplicated
	})
	natstest.Eventually(t, 5*time.Second, "under-replicated event", func() bool {
		return len(eventsOf(t, b.js, protocol.EventClusterUnderReplicated)) > 0
	})
	b.start(t, "aa", "b")
	natstest.Eventually(t, 10*time.Second, "healthy with two", func() bool { return b.state(t, "aa").Status == protocol.ClusterHealthy })
	time.Sleep(50 * time.Millisecond) // b started strictly before c
	b.start(t, "aa", "c")
	natstest.Eventually(t, 10*time.Second, "c refused", func() bool {
		m, ok := b.state(t, "aa").Member("p.c")
		return ok && m.Role == protocol.RoleRefused
	})
	evs := eventsOf(t, b.js, protocol.EventClusterMemberRefused)
	if len(evs) == 0 || evs[0].Agent != "p.c" {
		t.Fatalf("refused events %+v", evs)
	}
	t.Logf("refused: %s", evs[0].Reason)
	st := b.state(t, "aa")
	d, err := cluster.RouteIn(st, "")
	if err != nil || strings.Contains(fmt.Sprint(d.Members), "p.c") || len(d.Members) != 2 {
		t.Fatalf("active_active route %+v %v", d, err)
	}
	_ = x
}

func TestStateSyncConverges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.define(t, protocol.ClusterDefinition{Name: "sy", Mode: protocol.ModeActivePassive,
		TargetGroup: protocol.TargetGroup{Targets: []string{"h1"}}, Config: map[string]string{"image": "v1"}})
	ag := []*agent{b.start(t, "sy", "a"), b.start(t, "sy", "b"), b.start(t, "sy", "c")}
	var leader *agent
	natstest.Eventually(t, 10*time.Second, "leader", func() bool {
		for _, a := range ag {
			if a.m.View().IsLeader {
				leader = a
				return true
			}
		}
		return false
	})
	if err := leader.m.SetSync(cluster.SectionCachedDigests, "image", "sha256:abc"); err != nil {
		t.Fatal(err)
	}
	for _, a := range ag {
		if a != leader {
			if err := a.m.SetSync(cluster.SectionTaskStates, "x", "y"); err == nil {
				t.Fatal("a standby changed the sync state")
			}
		}
	}
	natstest.Eventually(t, 5*time.Second, "every member in sync", func() bool {
		for _, a := range ag {
			v := a.m.View()
			if !v.InSync || a.m.Sync().CachedDigests["image"] != "sha256:abc" || a.m.Sync().Configuration["image"] != "v1" {
				return false
			}
		}
		return true
	})
	// The state shows each member's digest equal to the leader's.
	natstest.Eventually(t, 5*time.Second, "state shows digests", func() bool {
		st := b.state(t, "sy")
		for _, m := range st.Members {
			if m.Digest != st.SyncDigest {
				return false
			}
		}
		return len(st.Members) == 3
	})
	// A configuration change reaches everyone.
	d, _, _ := b.store.Get(context.Background(), "sy")
	d.Config["image"] = "v2"
	if _, err := b.store.Update(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "config v2 everywhere", func() bool {
		for _, a := range ag {
			if a.m.Sync().Configuration["image"] != "v2" || !a.m.View().InSync {
				return false
			}
		}
		return true
	})
	// The leader dies. Its successor carries the sync state on: it starts
	// from the published one, or every member would delete the cached
	// digests and task states the old leader wrote.
	old := b.state(t, "sy").Leader
	leader.crash()
	var survivors []*agent
	for _, a := range ag {
		if a != leader {
			survivors = append(survivors, a)
		}
	}
	var next string
	natstest.Eventually(t, 10*time.Second, "a new leader's sync state everywhere", func() bool {
		next = b.state(t, "sy").Leader
		if next == "" || next == old {
			return false
		}
		for _, a := range survivors {
			if !a.m.View().InSync || a.m.Sync().Leader != next {
				return false
			}
		}
		return true
	})
	for _, a := range survivors {
		if got := a.m.Sync().CachedDigests["image"]; got != "sha256:abc" {
			t.Fatalf("%s after failover to %s: cached_digests[image] = %q, want sha256:abc (the new leader dropped it)", a.m.Key(), next, got)
		}
	}
}

func TestDeleteAndRedefineWhileMembersRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := protocol.ClusterDefinition{Name: "re", Mode: protocol.ModeActivePassive}
	b.define(t, d)
	ag := []*agent{b.start(t, "re", "a"), b.start(t, "re", "b")}
	leaders := func() int {
		n := 0
		for _, a := range ag {
			if a.m.View().IsLeader {
				n++
			}
		}
		return n
	}
	natstest.Eventually(t, 10*time.Second, "a leader", func() bool { return leaders() == 1 })
	if err := b.store.Delete(context.Background(), "re"); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, "nobody leads an undefined cluster", func() bool {
		for _, a := range ag {
			if v := a.m.View(); v.Defined || v.IsLeader {
				return false
			}
		}
		return true
	})
	b.define(t, d)
	natstest.Eventually(t, 10*time.Second, "a leader again", func() bool { return leaders() == 1 && b.state(t, "re").Leader != "" })
	natstest.Eventually(t, 5*time.Second, "deletion and creation are events", func() bool {
		return len(eventsOf(t, b.js, protocol.EventClusterDeleted)) == 1 && len(eventsOf(t, b.js, protocol.EventClusterCreated)) == 2
	})
}

// The supervisor assesses the leader failed: it steps down, a standby is
// promoted, and the failover says why.
func TestLeaderAssessedFailedStepsDown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.define(t, protocol.ClusterDefinition{Name: "hf", Mode: protocol.ModeActivePassive})
	b.start(t, "hf", "a")
	b.start(t, "hf", "b")
	var first protocol.ClusterState
	natstest.Eventually(t, 10*time.Second, "leader and standby", func() bool {
		first = b.state(t, "hf")
		return strings.Count(roles(first), "=standby") == 1 && first.Leader != ""
	})
	kv, err := b.js.KeyValue(context.Background(), protocol.BucketHealth)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), first.Leader, []byte(`{"level":"failed","score":0.1}`)); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, "the other member leads", func() bool {
		st := b.state(t, "hf")
		return st.Leader != "" && st.Leader != first.Leader
	})
	var reason string
	natstest.Eventually(t, 5*time.Second, "failover event", func() bool {
		for _, e := range eventsOf(t, b.js, protocol.EventClusterFailover) {
			if e.Data["from"] == first.Leader {
				reason = e.Reason // "health failed", or "stepped down" if its last report was not seen yet
				return true
			}
		}
		return false
	})
	natstest.Eventually(t, 5*time.Second, "the state says why", func() bool {
		m, _ := b.state(t, "hf").Member(first.Leader)
		return m.Role == protocol.RoleOffline && m.Reason == "health failed"
	})
	t.Logf("old leader %s: offline (health failed); failover event reason %q", first.Leader, reason)
}

package cluster_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Regression tests for the leader's lease, sync state and requests.

// startDraining is start with a draining switch.
func (b *bundle) startDraining(t *testing.T, clusterName, id string, draining *atomic.Bool) *agent {
	t.Helper()
	nc, js := b.srv.Connect(t)
	a := &agent{nc: nc, done: make(chan struct{})}
	m, err := cluster.NewMember(context.Background(), js, cluster.MemberConfig{
		Cluster: clusterName, Pool: "p", ID: id, Interval: 200 * time.Millisecond, Stagger: 100 * time.Millisecond,
		StartedAt: time.Now(), Load: func() (int, int) { return int(a.load.Load()), 4 }, Logger: zerolog.Nop(),
		Draining: draining.Load,
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

func (b *bundle) leaderOf(t *testing.T, ag ...*agent) *agent {
	t.Helper()
	var leader *agent
	natstest.Eventually(t, 10*time.Second, "a leader", func() bool {
		for _, a := range ag {
			if a.m.View().IsLeader && b.state(t, a.m.View().Cluster).Leader == a.m.Key() {
				leader = a
				return true
			}
		}
		return false
	})
	return leader
}

func (b *bundle) failover(t *testing.T, name, to string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := b.store.Request(ctx, name, protocol.ClusterRequest{Op: protocol.RequestFailover, To: to, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.WaitHandled(ctx, name, id); err != nil {
		t.Fatal(err)
	}
	return id
}

// A leader that leads again starts from the published sync state, not from
// what it published in its earlier term: what its successor wrote stays.
func TestSyncSurvivesLeadingAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.define(t, protocol.ClusterDefinition{Name: "sa", Mode: protocol.ModeActivePassive})
	ag := []*agent{b.start(t, "sa", "a"), b.start(t, "sa", "b")}
	first := b.leaderOf(t, ag...)
	second := ag[0]
	if second == first {
		second = ag[1]
	}
	if err := first.m.SetSync(cluster.SectionCachedDigests, "image", "sha256:abc"); err != nil {
		t.Fatal(err)
	}
	b.failover(t, "sa", second.m.Key())
	natstest.Eventually(t, 10*time.Second, "second leads", func() bool { return second.m.View().IsLeader })
	if err := second.m.SetSync(cluster.SectionTaskStates, "job.step", "done"); err != nil {
		t.Fatal(err)
	}
	inSyncWith := func(leader *agent) bool {
		for _, a := range ag {
			if !a.m.View().InSync || a.m.Sync().Leader != leader.m.Key() || a.m.Sync().TaskStates["job.step"] != "done" {
				return false
			}
		}
		return true
	}
	natstest.Eventually(t, 5*time.Second, "the second leader's entry everywhere", func() bool { return inSyncWith(second) })
	// Hand back (the first sits out two leases after handing off).
	b.failover(t, "sa", first.m.Key())
	natstest.Eventually(t, 15*time.Second, "first leads again, its sync everywhere", func() bool {
		if !first.m.View().IsLeader {
			return false
		}
		for _, a := range ag {
			if !a.m.View().InSync || a.m.Sync().Leader != first.m.Key() {
				return false
			}
		}
		return true
	})
	for _, a := range ag {
		s := a.m.Sync()
		if s.TaskStates["job.step"] != "done" || s.CachedDigests["image"] != "sha256:abc" {
			t.Fatalf("%s after leading again: task_states %v cached_digests %v (a former leader republished its old sync state)", a.m.Key(), s.TaskStates, s.CachedDigests)
		}
	}
}

// A deposed leader's late write of the sync state (a plain put) is ignored
// by the members, and the leader publishes its own again.
func TestStaleSyncWriteIgnoredAndRepaired(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.define(t, protocol.ClusterDefinition{Name: "ss", Mode: protocol.ModeActivePassive, Config: map[string]string{"image": "v1"}})
	ag := []*agent{b.start(t, "ss", "a"), b.start(t, "ss", "b"), b.start(t, "ss", "c")}
	leader := b.leaderOf(t, ag...)
	if err := leader.m.SetSync(cluster.SectionCachedDigests, "image", "sha256:abc"); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "every member in sync", func() bool {
		for _, a := range ag {
			if !a.m.View().InSync || a.m.Sync().CachedDigests["image"] != "sha256:abc" {
				return false
			}
		}
		return true
	})
	st := b.state(t, "ss")
	stale := protocol.ClusterSync{Leader: "p.old", Epoch: st.Epoch - 1, CapturedAt: time.Now().UTC(),
		Configuration: map[string]string{"image": "v1"}, CachedDigests: map[string]string{"image": "sha256:old"}}
	stale.Digest = cluster.Digest(stale)
	raw, _ := json.Marshal(stale)
	if _, err := b.store.Runtime().Put(context.Background(), protocol.ClusterSyncKey("ss"), raw); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "the leader publishes its sync state again", func() bool {
		for _, a := range ag {
			if got := a.m.Sync().CachedDigests["image"]; got != "sha256:abc" {
				t.Fatalf("%s applied a stale sync state (epoch %d < %d): cached_digests[image] = %q", a.m.Key(), stale.Epoch, st.Epoch, got)
			}
		}
		s, err := b.store.Sync(context.Background(), "ss")
		return err == nil && s.Leader == leader.m.Key() && s.CachedDigests["image"] == "sha256:abc"
	})
}

// A leader that steps down of its own accord and later leads again still
// reports the tasks it ran in its earlier term.
func TestResultOfAnEarlierTermStillReported(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.define(t, protocol.ClusterDefinition{Name: "rt", Mode: protocol.ModeActivePassive})
	var draining atomic.Bool
	a := b.startDraining(t, "rt", "a", &draining)
	b.leaderOf(t, a)
	e1 := a.m.View().Epoch
	// A task runs under e1 while the leader drains: it steps down.
	draining.Store(true)
	natstest.Eventually(t, 10*time.Second, "stepped down", func() bool { return !a.m.View().IsLeader })
	if err := a.m.AcceptResult(e1, ""); err != nil {
		t.Fatalf("resigned leader withholds its task's result: %v", err)
	}
	// It leads again under a new epoch before the task finishes.
	draining.Store(false)
	natstest.Eventually(t, 10*time.Second, "leads again", func() bool {
		v := a.m.View()
		return v.IsLeader && v.Epoch != e1
	})
	if err := a.m.AcceptResult(e1, ""); err != nil {
		t.Fatalf("result of the task run under epoch %d withheld after leading again under %d: %v", e1, a.m.View().Epoch, err)
	}
}

// A stalled events stream (every publish waits for its timeout) does not
// hold the lease renewal back: the leader stays leader.
func TestSlowEventsDoNotDeposeTheLeader(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.define(t, protocol.ClusterDefinition{Name: "se", Mode: protocol.ModeActivePassive})
	// Events are published to a subject that has a listener but never an
	// answer: each publish waits for its deadline.
	if err := b.js.DeleteStream(context.Background(), "WARDEN_EVENTS"); err != nil {
		t.Fatal(err)
	}
	nc, _ := b.srv.Connect(t)
	var stalled atomic.Int32
	if _, err := nc.Subscribe("warden.event.>", func(*nats.Msg) { stalled.Add(1) }); err != nil {
		t.Fatal(err)
	}
	a := b.start(t, "se", "a")
	natstest.Eventually(t, 10*time.Second, "leader", func() bool { return a.m.View().IsLeader })
	e1 := a.m.View().Epoch
	natstest.Eventually(t, 10*time.Second, "an event publish stalls", func() bool { return stalled.Load() > 0 })
	leases, err := b.js.KeyValue(context.Background(), protocol.BucketClusterLeases)
	if err != nil {
		t.Fatal(err)
	}
	// Watch the renewals: nine of them span three lease durations.
	var last uint64
	renewals := 0
	natstest.Eventually(t, 15*time.Second, "nine renewals while events stall", func() bool {
		if v := a.m.View(); !v.IsLeader || v.Epoch != e1 {
			t.Fatalf("leader deposed while events stalled (%d publishes): leader=%v epoch %d -> %d", stalled.Load(), v.IsLeader, e1, v.Epoch)
		}
		if e, err := leases.Get(context.Background(), protocol.ClusterLeaseKey("se")); err == nil && e.Revision() != last {
			if last != 0 {
				renewals++
			}
			last = e.Revision()
		}
		return renewals >= 9
	})
}

// Shortening lease_duration takes effect at the next renewal: the leader
// renews often enough for the new lease and keeps it.
func TestShorterLeaseKeepsTheLeader(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := protocol.ClusterDefinition{Name: "sl", Mode: protocol.ModeActivePassive}
	d.Membership.FailureThreshold = protocol.Duration(time.Second)
	d.Election.LeaseDuration = protocol.Duration(6 * time.Second)
	d.StateSync.Interval = protocol.Duration(300 * time.Millisecond)
	if _, err := b.store.Create(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	a := b.start(t, "sl", "a")
	b.leaderOf(t, a)
	e1 := a.m.View().Epoch
	d, _, _ = b.store.Get(context.Background(), "sl")
	d.Election.LeaseDuration = protocol.Duration(time.Second)
	if _, err := b.store.Update(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	leases, err := b.js.KeyValue(context.Background(), protocol.BucketClusterLeases)
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	renewals := 0
	natstest.Eventually(t, 15*time.Second, "six renewals after the lease was shortened", func() bool {
		if v := a.m.View(); !v.IsLeader || v.Epoch != e1 {
			t.Fatalf("leader lost its lease after lease_duration 6s -> 1s (%d renewals seen): leader=%v epoch %d -> %d", renewals, v.IsLeader, e1, v.Epoch)
		}
		if e, err := leases.Get(context.Background(), protocol.ClusterLeaseKey("sl")); err == nil && e.Revision() != last {
			if last != 0 {
				renewals++
			}
			last = e.Revision()
		}
		return renewals >= 6
	})
}

// A manual failover naming no member that could take over is refused: the
// leader keeps leading and the request's event says why.
func TestFailoverToUnknownMemberRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.define(t, protocol.ClusterDefinition{Name: "fu", Mode: protocol.ModeActivePassive})
	ag := []*agent{b.start(t, "fu", "a"), b.start(t, "fu", "b")}
	leader := b.leaderOf(t, ag...)
	e1 := leader.m.View().Epoch
	id := b.failover(t, "fu", "p.typo")
	// The request was deleted after the state was written: that state says
	// whether the leader handed off.
	st := b.state(t, "fu")
	if st.Handoff != "" || st.Leader != leader.m.Key() {
		t.Fatalf("failover to an unknown member carried out: leader %s handoff %q", st.Leader, st.Handoff)
	}
	if v := leader.m.View(); !v.IsLeader || v.Epoch != e1 {
		t.Fatalf("leader gave up: %+v", v)
	}
	natstest.Eventually(t, 5*time.Second, "the request event says why", func() bool {
		for _, e := range eventsOf(t, b.js, protocol.EventClusterRequest) {
			if e.ID == id {
				if e.Data["refused"] == "" {
					t.Fatalf("request event does not say it was refused: %+v", e)
				}
				t.Logf("refused: %s", e.Data["refused"])
				return true
			}
		}
		return false
	})
}

// Watch channels close when the member stops, whatever the caller's ctx.
func TestWatchClosedWhenMemberStops(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.define(t, protocol.ClusterDefinition{Name: "wc", Mode: protocol.ModeActivePassive})
	a := b.start(t, "wc", "a")
	ch := a.m.Watch(context.Background())
	b.leaderOf(t, a)
	a.cancel()
	<-a.done
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				if _, ok := <-a.m.Watch(context.Background()); ok {
					t.Fatal("Watch on a stopped member returned an open channel")
				}
				return
			}
		case <-deadline:
			t.Fatal("Watch channel still open 5s after the member stopped")
		}
	}
}

// A draining member of an active_active or sharded cluster still reports
// the tasks it was given before the drain took it out of the work (it was
// assigned them under the epoch they carry); others' tasks stay fenced.
func TestDrainingMemberReportsItsTasks(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{protocol.ModeSharded, protocol.ModeActiveActive} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tg := []string{"h0", "h1", "h2", "h3", "h4", "h5", "h6", "h7"}
			b.define(t, protocol.ClusterDefinition{Name: "dr", Mode: mode, TargetGroup: protocol.TargetGroup{Targets: tg}})
			var draining, never atomic.Bool
			// b leads (coordinates), so a never resigns a lease of its own.
			b.leaderOf(t, b.startDraining(t, "dr", "b", &never))
			a := b.startDraining(t, "dr", "a", &draining)
			var st protocol.ClusterState
			natstest.Eventually(t, 10*time.Second, "both take work, a knows it", func() bool {
				st = b.state(t, "dr")
				ma, _ := st.Member("p.a")
				mb, _ := st.Member("p.b")
				return ma.Role == protocol.RoleMember && mb.Role == protocol.RoleMember && a.m.View().Epoch == st.Epoch
			})
			target := ""
			if mode == protocol.ModeSharded {
				target = mustOwn(t, st, "p.a")
			}
			if err := a.m.Accept(st.Epoch, target); err != nil {
				t.Fatalf("a refuses its own task: %v", err)
			}
			// The task runs; a drains meanwhile and is taken out of the work.
			draining.Store(true)
			natstest.Eventually(t, 10*time.Second, "a offline and knows it", func() bool {
				v := a.m.View()
				return v.Role == protocol.RoleOffline && v.Epoch > st.Epoch
			})
			if err := a.m.AcceptResult(st.Epoch, target); err != nil {
				t.Fatalf("draining member withholds the result of its task (epoch %d, target %q): %v", st.Epoch, target, err)
			}
			if mode == protocol.ModeSharded {
				// Only what it was given: b's target under that epoch stays fenced.
				if err := a.m.AcceptResult(st.Epoch, mustOwn(t, st, "p.b")); err == nil {
					t.Fatal("draining member reports a task for a target it did not own")
				}
			}
		})
	}
}

func mustOwn(t *testing.T, st protocol.ClusterState, key string) string {
	t.Helper()
	m, _ := st.Member(key)
	if len(m.Targets) == 0 {
		t.Fatalf("%s owns nothing: %+v", key, st)
	}
	return m.Targets[0]
}

// A lease_duration longer than the leases bucket's TTL (the supervisor's
// lease_ttl, 5 s here): the server removes a key that old whatever its own
// TTL, so the held lease vanished between renewals, a standby took it, and
// the old leader still counted itself leader: two leaders. The lease is
// capped at the bucket's TTL.
func TestLeaseLongerThanTheBucketsTTLHasOneLeader(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := protocol.ClusterDefinition{Name: "ll", Mode: protocol.ModeActivePassive}
	d.Membership.FailureThreshold = protocol.Duration(time.Second)
	d.Election.LeaseDuration = protocol.Duration(30 * time.Second)
	d.StateSync.Interval = protocol.Duration(300 * time.Millisecond)
	if _, err := b.store.Create(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	ag := []*agent{b.start(t, "ll", "a"), b.start(t, "ll", "b")}
	leader := b.leaderOf(t, ag...)
	epoch := leader.m.View().Epoch
	// Past the bucket's 5 s: under the old code the key was gone by then.
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		n := 0
		for _, a := range ag {
			if a.m.View().IsLeader {
				n++
			}
		}
		if n > 1 {
			t.Fatalf("two members count themselves leader (lease_duration 30s over a 5s bucket TTL)")
		}
		if v := leader.m.View(); !v.IsLeader || v.Epoch != epoch {
			t.Fatalf("the leader lost its lease: leader=%v epoch %d -> %d", v.IsLeader, epoch, v.Epoch)
		}
	}
}

// A definition stored with a lease_duration that is not whole seconds
// (before that was refused, or written by hand) is still followed, with
// the whole seconds: the lease key carries the TTL the server keeps, the
// one its holder counts on, not "1.5s" (which the server keeps 1 s).
func TestStoredFractionalLeaseDurationUsesWholeSeconds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	d := cluster.WithDefaults(protocol.ClusterDefinition{Name: "fr", Mode: protocol.ModeActivePassive})
	d.Membership.FailureThreshold = protocol.Duration(time.Second)
	d.Election.LeaseDuration = protocol.Duration(1500 * time.Millisecond)
	raw, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Definitions().Put(ctx, "fr", raw); err != nil {
		t.Fatal(err)
	}
	a := b.start(t, "fr", "a")
	b.leaderOf(t, a)
	s, err := b.js.Stream(ctx, "KV_"+protocol.BucketClusterLeases)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := s.GetLastMsgForSubject(ctx, "$KV."+protocol.BucketClusterLeases+"."+protocol.ClusterLeaseKey("fr"))
	if err != nil {
		t.Fatal(err)
	}
	if got := msg.Header.Get(jetstream.MsgTTLHeader); got != "1s" {
		t.Fatalf("the lease key carries TTL %q, want \"1s\" (lease_duration 1500ms, kept in whole seconds)", got)
	}
}

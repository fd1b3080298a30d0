package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
)

// startReconnecting is start on a connection that reconnects forever,
// reconnectWait apart (natstest.ConnectReconnecting), for tests that stop
// and start the server.
func (b *bundle) startReconnecting(t *testing.T, clusterName, id string, reconnectWait time.Duration) *agent {
	t.Helper()
	nc, js := b.srv.ConnectReconnecting(t, reconnectWait)
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

// After a NATS outage the first member to reconnect leads with a view in
// which every other member's report is older than failure_threshold. "I
// could not see" is not "it is gone": the members that come back within
// one threshold of the leader's fresh view keep their roles and shards,
// and one that never comes back is marked offline once the view can be
// trusted.
func TestOutageDoesNotMarkReturningMembersOffline(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{protocol.ModeSharded, protocol.ModeActivePassive} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testOutage(t, mode)
		})
	}
}

func testOutage(t *testing.T, mode string) {
	const threshold = 3 * time.Second
	b := setup(t)
	// The test's own reads must come back at once after the restart.
	_, js := b.srv.ConnectReconnecting(t, 50*time.Millisecond)
	store, err := cluster.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	state := func() protocol.ClusterState {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		st, _, _ := store.State(ctx, "out")
		return st
	}
	var tg []string
	for i := range 12 {
		tg = append(tg, fmt.Sprintf("host-%02d", i))
	}
	d := protocol.ClusterDefinition{Name: "out", Mode: mode, TargetGroup: protocol.TargetGroup{Targets: tg},
		Membership: protocol.ClusterMembership{Minimum: 1, Desired: 4, FailureThreshold: protocol.Duration(threshold)},
		Election:   protocol.ClusterElection{LeaseDuration: protocol.Duration(time.Second)},
		StateSync:  protocol.ClusterStateSync{Interval: protocol.Duration(300 * time.Millisecond)}}
	if _, err := store.Create(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	// a reconnects at once; b and c only when the test says so (their
	// reconnect wait is longer than the test), after a has led with its
	// view of the old reports; d never comes back.
	fast := b.startReconnecting(t, "out", "a", 50*time.Millisecond)
	slow := []*agent{b.startReconnecting(t, "out", "b", time.Hour), b.startReconnecting(t, "out", "c", time.Hour)}
	dead := b.startReconnecting(t, "out", "d", time.Hour)
	live := []string{"p.a", "p.b", "p.c"}

	var before protocol.ClusterState
	natstest.Eventually(t, 10*time.Second, "four healthy members", func() bool {
		before = state()
		return before.Healthy == 4 && before.Status == protocol.ClusterHealthy
	})
	t.Logf("before: leader %s epoch %d: %s", before.Leader, before.Epoch, roles(before))
	seen := map[string]bool{} // events raised before the outage
	for _, kind := range []protocol.EventKind{protocol.EventClusterMemberLeft, protocol.EventClusterFailover} {
		for _, e := range eventsOf(t, js, kind) {
			seen[e.ID] = true
		}
	}

	// The outage: every member loses the server for longer than the
	// failure threshold and the lease, so their reports are stale and the
	// lease is free when it returns. d dies meanwhile.
	b.srv.Down()
	dead.crash()
	natstest.Eventually(t, 5*time.Second, "members see the outage", func() bool {
		return fast.nc.Status() != nats.CONNECTED && slow[0].nc.Status() != nats.CONNECTED && slow[1].nc.Status() != nats.CONNECTED
	})
	outage := time.NewTimer(threshold + time.Second) // the length of the outage, not a wait for a condition
	<-outage.C
	b.srv.Up(t)

	// a reconnects and leads under a new lease first.
	var first protocol.ClusterState
	natstest.Eventually(t, 10*time.Second, "a leads after the outage", func() bool {
		first = state()
		return first.Leader == fast.m.Key() && first.LeaseEpoch > before.LeaseEpoch
	})
	t.Logf("first state after the outage: epoch %d: %s", first.Epoch, roles(first))
	for _, k := range live {
		if m, _ := first.Member(k); m.Role == protocol.RoleOffline {
			t.Errorf("the first leader after the outage has %s offline: %s", k, m.Reason)
		}
	}
	for _, a := range slow {
		if err := a.nc.ForceReconnect(); err != nil {
			t.Fatal(err)
		}
	}

	// The view settles: d is offline for not reporting, the others serve
	// as before.
	var after protocol.ClusterState
	natstest.Eventually(t, 15*time.Second, "d offline, a, b and c healthy", func() bool {
		after = state()
		m, ok := after.Member(dead.m.Key())
		return ok && m.Role == protocol.RoleOffline && after.Healthy == 3
	})
	t.Logf("after: epoch %d: %s", after.Epoch, roles(after))
	natstest.Eventually(t, 5*time.Second, "d's member_left event", func() bool {
		for _, e := range eventsOf(t, js, protocol.EventClusterMemberLeft) {
			if !seen[e.ID] && e.Agent == dead.m.Key() {
				return true
			}
		}
		return false
	})

	// No returning member was ever marked offline or lost its work.
	for _, e := range eventsOf(t, js, protocol.EventClusterMemberLeft) {
		if !seen[e.ID] && slices.Contains(live, e.Agent) {
			t.Errorf("%s marked offline after the outage (epoch %s): %s", e.Agent, e.Data["epoch"], e.Reason)
		}
	}
	if mode == protocol.ModeSharded {
		for _, e := range eventsOf(t, js, protocol.EventClusterFailover) {
			if seen[e.ID] {
				continue
			}
			if slices.ContainsFunc(strings.Split(e.Data["from"], ","), func(k string) bool { return slices.Contains(live, k) }) {
				t.Errorf("shards of %s failed over after the outage (epoch %s): moved %s", e.Data["from"], e.Data["epoch"], e.Data["moved"])
			}
		}
		checkOwners(t, after, tg)
		for _, k := range live {
			was, _ := before.Member(k)
			now, _ := after.Member(k)
			for _, x := range was.Targets {
				if !slices.Contains(now.Targets, x) {
					t.Errorf("%s lost %s across the outage", k, x)
				}
			}
		}
	}
	for _, k := range live {
		if m, _ := after.Member(k); m.Role == protocol.RoleOffline {
			t.Errorf("%s offline after the view settled: %s", k, m.Reason)
		}
	}
}

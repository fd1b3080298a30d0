package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// An active-passive leader whose term's epoch is above its lease revision
// (after a mode change, see TestModeChangeNeverLowersEpoch) accepts the
// tasks routed under the state's epoch, and only those.
func TestActivePassiveAcceptsTheTermsEpoch(t *testing.T) {
	t.Parallel()
	d := def(protocol.ModeActivePassive, 1, 1, 0, "h1")
	st, _ := Compute(Input{Def: d, Prev: protocol.ClusterState{Mode: protocol.ModeSharded, Epoch: 7, Owners: []string{"p.a"}},
		Members: members("a"), Leader: "p.a", LeaseEpoch: 5, Now: t0})
	m := &Member{key: "p.a", def: &d, state: st, log: zerolog.Nop(),
		lease: &lease{now: time.Now, epoch: 5, validTo: time.Now().Add(time.Hour)}}
	route, err := RouteIn(st, "h1")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Accept(route.Epoch, "h1"); err != nil {
		t.Fatalf("leader refuses a task routed under its state's epoch %d (lease 5): %v", route.Epoch, err)
	}
	if err := m.Accept(5, "h1"); err == nil {
		t.Fatal("leader accepts a task under its lease revision, not its term's epoch")
	}
	if v := m.View(); v.Epoch != route.Epoch {
		t.Fatalf("view epoch %d, state epoch %d", v.Epoch, route.Epoch)
	}
}

// A sharded leader whose state key is removed mid-term (deleted by hand,
// a roll-up of the runtime bucket) writes its next state above every epoch
// it used: Compute restarts from the lease's revision when there is no
// state, and the epoch went down, reused with other owners (tasks queued
// under the higher one refused, a draining member's record of what it
// took muddled).
//
// Old code: "epoch went down from 6 to 1 after the state key was removed".
func TestEpochNeverDecreasesAfterTheStateIsRemoved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, _, js := natstest.Start(t, streams.Options{})
	store, err := Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	d, err := store.Create(ctx, protocol.ClusterDefinition{Name: "ep", Mode: protocol.ModeSharded,
		TargetGroup: protocol.TargetGroup{Name: "h", Targets: []string{"t1", "t2", "t3", "t4"}}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMember(ctx, js, MemberConfig{Cluster: "ep", Pool: "p", ID: "a", Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	m.def = &d
	if won, err := m.lease.acquire(ctx); err != nil || !won {
		t.Fatal(won, err)
	}
	epoch, _ := m.lease.held()
	var pub published
	rep := func(id string) seen {
		r := protocol.ClusterMemberReport{Cluster: "ep", Pool: "p", ID: id, MaxConcurrent: 1}
		if id[0] == '~' {
			r.ID, r.Draining = id[1:], true
		}
		return seen{report: r, at: time.Now()}
	}
	// Members come and go: the epoch runs past the lease's revision.
	for i, set := range [][]string{{"b", "c"}, {"~b", "c"}, {"b", "c"}, {"b", "~c"}, {"b", "c"}, {"~b", "c"}} {
		m.mu.Lock()
		m.reports = map[string]seen{}
		for _, id := range set {
			r := rep(id)
			m.reports[r.report.Key()] = r
		}
		m.mu.Unlock()
		m.step(ctx, epoch, &pub)
		if i == 0 && m.state.Epoch == 0 {
			t.Fatal("no state written")
		}
	}
	before := m.state.Epoch
	t.Logf("lease epoch %d, state epoch %d", epoch, before)
	if err := store.rt.Delete(ctx, protocol.ClusterStateKey("ep")); err != nil {
		t.Fatal(err)
	}
	// What the watch does on the deletion (apply).
	m.mu.Lock()
	m.state, m.stateRev = protocol.ClusterState{}, 0
	m.mu.Unlock()
	for range 3 {
		m.step(ctx, epoch, &pub)
	}
	st, _, err := store.State(ctx, "ep")
	if err != nil {
		t.Fatal(err)
	}
	if st.Epoch < before {
		t.Fatalf("epoch went down from %d to %d after the state key was removed (same leader, same term)", before, st.Epoch)
	}
}

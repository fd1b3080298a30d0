package cluster

import (
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/protocol"
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

package cluster

import (
	"slices"
	"testing"

	"github.com/wardenhq/warden/pkg/protocol"
)

// While the leader's sight is not clear, members the previous state had
// taking part keep their places whether their reports are stale or gone;
// what fresh reports say (draining, a newcomer) still counts, and members
// already offline stay offline.
func TestHoldUnseenKeepsThePreviousJudgement(t *testing.T) {
	t.Parallel()
	d := def(protocol.ModeSharded, 1, 4, 0, targets(20)...)
	prev, _ := Compute(Input{Def: d, Members: members("a", "b", "c", "d", "-e"), Leader: "p.a", LeaseEpoch: 3, Now: t0})
	if roles(prev) != "a=member b=member c=member d=member e=offline" {
		t.Fatalf("previous state %s", roles(prev))
	}
	// After an outage: b's report is stale, c's gone from the bucket, d
	// reported it is draining, e is still silent, f is new.
	seen := members("a", "-b", "d~", "-e", "f")
	held := holdUnseen(prev, seen)
	for k, want := range map[string]bool{"p.b": true, "p.c": true, "p.d": false, "p.e": false, "p.f": false} {
		if held[k].Unseen != want {
			t.Errorf("%s unseen %v, want %v", k, held[k].Unseen, want)
		}
	}
	if seen["p.b"].Alive || seen["p.b"].Unseen {
		t.Fatal("holdUnseen changed its input")
	}
	next, evs := Compute(Input{Def: d, Prev: prev, Members: held, Leader: "p.a", LeaseEpoch: 9, Now: t0})
	if got := roles(next); got != "a=member b=member c=member d=offline e=offline f=member" {
		t.Fatalf("while blind: %s", got)
	}
	// b and c give up only what the newcomer f takes (rendezvous hashing).
	fs, _ := next.Member("p.f")
	for _, k := range []string{"p.b", "p.c"} {
		was, _ := prev.Member(k)
		now, _ := next.Member(k)
		for _, x := range was.Targets {
			if !slices.Contains(now.Targets, x) && !slices.Contains(fs.Targets, x) {
				t.Errorf("%s lost %s while unseen", k, x)
			}
		}
	}
	for _, e := range evs {
		if e.Kind == protocol.EventClusterMemberLeft && e.Agent != "p.d" {
			t.Errorf("%s left while unseen: %s", e.Agent, e.Reason)
		}
	}

	// Nothing is handed to an unseen member, and a leader it succeeds lost
	// its lease rather than stepped down.
	if why := handoffRefusal(next, held, "p.b"); why != "not reporting" {
		t.Errorf("handoff to an unseen member: %q", why)
	}
	ap := def(protocol.ModeActivePassive, 1, 2, 0)
	was, _ := Compute(Input{Def: ap, Members: members("a", "b"), Leader: "p.b", LeaseEpoch: 4, Now: t0})
	_, evs = Compute(Input{Def: ap, Prev: was, Members: holdUnseen(was, members("a", "-b")), Leader: "p.a", LeaseEpoch: 8, Now: t0})
	var failovers []protocol.Event
	for _, e := range evs {
		if e.Kind == protocol.EventClusterFailover {
			failovers = append(failovers, e)
		}
	}
	if len(failovers) != 1 || failovers[0].Agent != "p.b" || failovers[0].Reason != "lease lost" {
		t.Errorf("failover from the unseen leader p.b: %+v, want exactly one from p.b, \"lease lost\"", failovers)
	}
}

package cluster

import (
	"fmt"
	"testing"

	"github.com/wardenhq/warden/pkg/protocol"
)

func TestElectionOrder(t *testing.T) {
	t.Parallel()
	c := []Candidate{
		{Key: "p.a", Load: 0.5},
		{Key: "p.b", Standby: true, Load: 0.9},
		{Key: "p.c", Standby: true, Load: 0.1},
		{Key: "p.d", Load: 0},
	}
	for _, tc := range []struct {
		strategy, previous, handoff string
		want                        string
	}{
		{protocol.StrategyStandby, "", "", "[p.c p.b p.d p.a]"},
		{protocol.StrategyLeastLoaded, "", "", "[p.d p.c p.a p.b]"},
		{protocol.StrategyRoundRobin, "p.b", "", "[p.c p.d p.a p.b]"},
		{protocol.StrategyStandby, "", "p.a", "[p.a p.c p.b p.d]"},
	} {
		got := fmt.Sprint(ElectionOrder(c, tc.strategy, tc.previous, tc.handoff))
		if got != tc.want {
			t.Errorf("%s prev=%q handoff=%q: %s, want %s", tc.strategy, tc.previous, tc.handoff, got, tc.want)
		}
	}
	if Rank([]string{"p.a", "p.b"}, "p.b") != 1 || Rank([]string{"p.a"}, "p.z") != -1 {
		t.Error("rank")
	}
}

func TestCandidatesSkipUnhealthyRefusedAndExcluded(t *testing.T) {
	t.Parallel()
	prev := protocol.ClusterState{
		Excluded: []string{"p.e"},
		Members: []protocol.ClusterMember{
			{Key: "p.a", Role: protocol.RoleStandby},
			{Key: "p.r", Role: protocol.RoleRefused},
		},
	}
	reps := []protocol.ClusterMemberReport{
		{Pool: "p", ID: "a", MaxConcurrent: 4, InFlight: 2},
		{Pool: "p", ID: "b"},
		{Pool: "p", ID: "d", Draining: true},
		{Pool: "p", ID: "f", Health: "failed"},
		{Pool: "p", ID: "e"},
		{Pool: "p", ID: "r"},
	}
	got := Candidates(prev, reps)
	if fmt.Sprint(got) != "[{p.a true 0.5} {p.b false 0}]" {
		t.Fatalf("candidates %v", got)
	}
}

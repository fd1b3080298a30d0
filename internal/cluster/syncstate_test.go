package cluster

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/wardenhq/warden/pkg/protocol"
)

func randomSync(r *rand.Rand) protocol.ClusterSync {
	var s protocol.ClusterSync
	for _, name := range sections {
		m := map[string]string{}
		for range r.IntN(6) {
			m[fmt.Sprint("k", r.IntN(8))] = fmt.Sprint("v", r.IntN(3))
		}
		if r.IntN(4) == 0 {
			m = nil
		}
		*section(&s, name) = m
	}
	return s
}

func TestApplyDiffConverges(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		a, b := randomSync(r), randomSync(r)
		b.Digest = Digest(b)
		got := Apply(a, Diff(a, b))
		if got.Digest != b.Digest {
			t.Fatalf("case %d: digest %s after apply, want %s\na=%+v\nb=%+v\ngot=%+v", i, got.Digest, b.Digest, a, b, got)
		}
		if len(Diff(got, b)) != 0 {
			t.Fatalf("case %d: diff left after apply: %v", i, Diff(got, b))
		}
	}
}

func TestApplyDoesNotModifyItsInput(t *testing.T) {
	t.Parallel()
	a := protocol.ClusterSync{Configuration: map[string]string{"x": "1"}}
	_ = Apply(a, []Change{{Section: SectionConfiguration, Key: "x", Value: "2"}, {Section: SectionTaskStates, Key: "j.s", Value: "running"}})
	if a.Configuration["x"] != "1" || a.TaskStates != nil {
		t.Fatal("input modified")
	}
}

func TestDigestIgnoresEmptyVersusNilAndMetadata(t *testing.T) {
	t.Parallel()
	a := protocol.ClusterSync{Leader: "p.a", Epoch: 3, Configuration: map[string]string{}}
	b := protocol.ClusterSync{Leader: "p.b", Epoch: 9}
	if Digest(a) != Digest(b) {
		t.Fatal("digest depends on metadata or empty sections")
	}
}

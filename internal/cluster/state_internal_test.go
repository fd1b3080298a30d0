package cluster

import (
	"context"
	"testing"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// A leader whose state was deleted (warden cluster delete) while its own
// write was landing ends up holding that write's revision after the watch
// reported the deletion. Every Update against that revision failed, so
// after the cluster was defined again it led without ever writing a state:
// nobody else saw a leader (TestDeleteAndRedefineWhileMembersRun, about 1
// run in 40 under -race). A lost compare-and-set now reads the state again.
func TestLeaderWritesAStateDeletedUnderIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, _, js := natstest.Start(t, streams.Options{})
	store, err := Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	d, err := store.Create(ctx, protocol.ClusterDefinition{Name: "sd", Mode: protocol.ModeActivePassive})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMember(ctx, js, MemberConfig{Cluster: "sd", Pool: "p", ID: "a", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	m.def = &d // no watches run: what the member holds is only what the test gives it
	term := func() uint64 {
		t.Helper()
		if won, err := m.lease.acquire(ctx); err != nil || !won {
			t.Fatalf("lease: won %v, %v", won, err)
		}
		epoch, _ := m.lease.held()
		return epoch
	}
	var pub published
	first := term()
	m.step(ctx, first, &pub)
	if _, rev, err := store.State(ctx, "sd"); err != nil || rev != m.stateRev {
		t.Fatalf("first term's state: rev %d (member holds %d), %v", rev, m.stateRev, err)
	}
	// Deleted under the member, which still holds the deleted revision.
	if err := store.rt.Delete(ctx, protocol.ClusterStateKey("sd")); err != nil {
		t.Fatal(err)
	}
	m.lease.release(ctx)
	second := term()
	for range 3 {
		m.step(ctx, second, &pub)
	}
	st, _, err := store.State(ctx, "sd")
	if err != nil {
		t.Fatalf("the second term (lease epoch %d) wrote no state: %v", second, err)
	}
	if st.Leader != "p.a" || st.LeaseEpoch != second {
		t.Fatalf("state: leader %q lease epoch %d, want p.a %d", st.Leader, st.LeaseEpoch, second)
	}
}

package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// A request no leader handled stayed for good: a `warden cluster failover`
// that timed out while the cluster had no leader (the CLI said it was not
// done) was carried out by whichever leader came next, hours later. It now
// lapses after RequestTTL (1s here), and RemoveRequest withdraws one.
func TestUnhandledRequestLapses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, _, js := natstest.Start(t, streams.Options{})
	store, err := Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	store.requestTTL = time.Second
	if _, err := store.Create(ctx, protocol.ClusterDefinition{Name: "lapse", Mode: protocol.ModeActivePassive}); err != nil {
		t.Fatal(err)
	}
	gone := func(id string) bool {
		_, err := store.Runtime().Get(ctx, protocol.ClusterRequestKey("lapse", id))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}
	lapsing, err := store.Request(ctx, "lapse", protocol.ClusterRequest{Op: protocol.RequestFailover})
	if err != nil {
		t.Fatal(err)
	}
	withdrawn, err := store.Request(ctx, "lapse", protocol.ClusterRequest{Op: protocol.RequestFailover})
	if err != nil {
		t.Fatal(err)
	}
	if gone(lapsing) || gone(withdrawn) {
		t.Fatal("a request is gone at once")
	}
	if err := store.RemoveRequest(ctx, "lapse", withdrawn); err != nil {
		t.Fatal(err)
	}
	if !gone(withdrawn) {
		t.Fatal("a withdrawn request is still there")
	}
	natstest.Eventually(t, 10*time.Second, "the unhandled request lapses", func() bool { return gone(lapsing) })
}

// A requester that gave up waiting withdrew its request, but a leader that
// had already copied it carried it out anyway, so the CLI said "withdrawn"
// of a failover that happened. The leader now claims a request before
// acting and the requester withdraws it, both by compare-and-set: exactly
// one wins.
func TestClaimAndWithdrawExcludeEachOther(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, _, js := natstest.Start(t, streams.Options{})
	store, err := Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Create(ctx, protocol.ClusterDefinition{Name: "cw", Mode: protocol.ModeActivePassive}); err != nil {
		t.Fatal(err)
	}
	seen := func(id string) (protocol.ClusterRequest, uint64) {
		t.Helper()
		e, err := store.Runtime().Get(ctx, protocol.ClusterRequestKey("cw", id))
		if err != nil {
			t.Fatal(err)
		}
		var r protocol.ClusterRequest
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			t.Fatal(err)
		}
		r.ID = id
		return r, e.Revision()
	}

	// Withdrawn first: the leader's claim, at the revision it saw, fails.
	id, err := store.Request(ctx, "cw", protocol.ClusterRequest{Op: protocol.RequestFailover})
	if err != nil {
		t.Fatal(err)
	}
	r, rev := seen(id)
	if err := store.WithdrawRequest(ctx, "cw", id); err != nil {
		t.Fatalf("withdraw an unclaimed request: %v", err)
	}
	if err := store.claimRequest(ctx, "cw", r, rev, "p.a"); err == nil {
		t.Fatal("a leader claimed a withdrawn request")
	}

	// Claimed first: the withdrawal fails, naming the leader.
	id, err = store.Request(ctx, "cw", protocol.ClusterRequest{Op: protocol.RequestFailover})
	if err != nil {
		t.Fatal(err)
	}
	r, rev = seen(id)
	if err := store.claimRequest(ctx, "cw", r, rev, "p.a"); err != nil {
		t.Fatal(err)
	}
	if err := store.WithdrawRequest(ctx, "cw", id); !errors.Is(err, ErrClaimed) || !strings.Contains(err.Error(), "p.a") {
		t.Fatalf("withdraw a claimed request: %v, want ErrClaimed naming p.a", err)
	}
	if got, _ := seen(id); got.ClaimedBy != "p.a" {
		t.Fatalf("claimed request reads %+v", got)
	}
	// Gone (handled): not found.
	if err := store.RemoveRequest(ctx, "cw", id); err != nil {
		t.Fatal(err)
	}
	if err := store.WithdrawRequest(ctx, "cw", id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("withdraw a handled request: %v, want ErrNotFound", err)
	}
}

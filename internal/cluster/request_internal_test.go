package cluster

import (
	"context"
	"errors"
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

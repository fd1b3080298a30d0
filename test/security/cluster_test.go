package security

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/creds"
	"github.com/wardenhq/warden/pkg/protocol"
)

// TestClusterMemberCannotLoseDefinitions: a cluster member writes keys of
// a bucket with limit markers (its report expires), on which the server
// keeps roll-ups on, and NATS permissions cannot refuse a header. When the
// definitions shared that bucket, a member's "Nats-Rollup: all" on its
// own state key removed every cluster's definition for good. Definitions
// are now in a bucket members only read: the member leads its cluster with
// its own credential (nothing refused), its roll-up empties only the
// runtime bucket, and every definition stays. The same for the leases:
// the member's cluster lease is apart from the supervisor's.
func TestClusterMemberCannotLoseDefinitions(t *testing.T) {
	d := start(t, pool+".m1@web")
	d.setupStreams(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	admin := d.connect(t, creds.RoleAdmin)
	st, err := cluster.Open(ctx, admin.js)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"web", "db"} {
		if _, err := st.Create(ctx, protocol.ClusterDefinition{Name: name, Mode: protocol.ModeActivePassive}); err != nil {
			t.Fatalf("define %s: %v", name, err)
		}
	}

	m1 := d.connect(t, creds.AgentIdentity(pool, "m1"))
	m, err := cluster.NewMember(ctx, m1.js, cluster.MemberConfig{Cluster: "web", Pool: pool, ID: "m1",
		Interval: 200 * time.Millisecond, StartedAt: time.Now(), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatalf("member with its own credential: %v", err)
	}
	mctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(mctx) }()
	defer func() { stop(); <-done }()
	waitFor(t, 15*time.Second, "m1 leads web and its state says so", func() bool {
		s, _, err := st.State(ctx, "web")
		return err == nil && s.Leader == protocol.PresenceKey(pool, "m1")
	})
	if got := m1.refusals(); len(got) != 0 {
		t.Fatalf("the member's own work was refused: %v", got)
	}

	// The roll-up reaches the server and is applied to the runtime bucket.
	msg := nats.NewMsg("$KV." + protocol.BucketClusterRuntime + "." + protocol.ClusterStateKey("web"))
	msg.Data = []byte(`{}`)
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupAll)
	if _, err := m1.js.PublishMsg(ctx, msg); err != nil {
		t.Fatalf("roll-up on its own state key: %v", err)
	}
	// A write in the definitions bucket, its own cluster's key included,
	// is refused.
	for _, subj := range []string{"$KV." + protocol.BucketClusters + ".web", "$KV." + protocol.BucketClusters + ".db"} {
		m := nats.NewMsg(subj)
		m.Data = []byte(`{}`)
		m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupAll)
		_ = m1.nc.PublishMsg(m)
		m1.expectRefused(t, "publish", subj)
	}
	for _, name := range []string{"web", "db"} {
		if def, _, err := st.Get(ctx, name); err != nil || def.Name != name {
			t.Fatalf("definition %s after the member's roll-up: %+v, %v", name, def, err)
		}
	}
	// The supervisor's lease is apart too: a member's roll-up on its own
	// cluster's lease empties the cluster leases only (it deposed the
	// supervisor when they shared warden_leases), and it cannot write the
	// supervisor's key.
	sup := d.connect(t, creds.RoleSupervisor)
	leases, err := sup.js.KeyValue(ctx, protocol.BucketLeases)
	if err != nil {
		t.Fatal(err)
	}
	supRev, err := leases.Create(ctx, "supervisor", []byte(`{"id":"sup-1"}`))
	if err != nil {
		t.Fatalf("the supervisor's lease: %v", err)
	}
	msg = nats.NewMsg("$KV." + protocol.BucketClusterLeases + "." + protocol.ClusterLeaseKey("web"))
	msg.Data = []byte(`{}`)
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupAll)
	if _, err := m1.js.PublishMsg(ctx, msg); err != nil {
		t.Fatalf("roll-up on its own lease key: %v", err)
	}
	if e, err := leases.Get(ctx, "supervisor"); err != nil || e.Revision() != supRev {
		t.Fatalf("the supervisor's lease after a member's roll-up on its cluster's lease: %v (revision %d, want %d)", err, revOf(e), supRev)
	}
	_ = m1.nc.Publish("$KV."+protocol.BucketLeases+".supervisor", []byte(`{"id":"m1"}`))
	m1.expectRefused(t, "publish", "$KV."+protocol.BucketLeases+".supervisor")

	// The leader writes its state again (a moment lost, nothing for good).
	waitFor(t, 15*time.Second, "m1's state is back", func() bool {
		s, _, err := st.State(ctx, "web")
		return err == nil && s.Leader == protocol.PresenceKey(pool, "m1")
	})
	if _, _, err := st.State(ctx, "db"); !errors.Is(err, cluster.ErrNotFound) {
		t.Fatalf("db (no member) has a state: %v", err)
	}
}

func revOf(e jetstream.KeyValueEntry) uint64 {
	if e == nil {
		return 0
	}
	return e.Revision()
}

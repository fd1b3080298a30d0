package chaos

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	agentcluster "github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/pkg/protocol"
)

// defineChaosCluster defines the active-passive cluster the agents join
// (default lease and failure threshold: 3 s). The cluster's "cluster" jobs
// are checked like every other job, plus: under one cluster epoch, one
// member completed steps.
func defineChaosCluster(ctx context.Context, t *testing.T, js jetstream.JetStream) {
	t.Helper()
	var st *agentcluster.Store
	waitFor(t, 20*time.Second, "the clusters bucket", func() bool {
		var err error
		st, err = agentcluster.Open(ctx, js)
		return err == nil
	})
	_, err := st.Create(ctx, protocol.ClusterDefinition{Name: chaosCluster, Mode: protocol.ModeActivePassive,
		Membership: protocol.ClusterMembership{Minimum: 1, Desired: 4}})
	if err != nil && !errors.Is(err, agentcluster.ErrExists) {
		t.Fatal(err)
	}
}

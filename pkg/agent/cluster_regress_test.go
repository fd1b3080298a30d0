package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
)

// WatchCluster's channel closes when the agent stops, even while the
// caller's context lives on: `for v := range ch` must end.
func TestWatchClusterClosedWhenAgentStops(t *testing.T) {
	t.Parallel()
	cfg := testConfig("a")
	cfg.Cluster = "wc"
	b := setup(t, cfg, nil)
	st, err := cluster.Open(context.Background(), b.js)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Create(context.Background(), protocol.ClusterDefinition{Name: "wc", Mode: protocol.ModeActivePassive,
		Membership: protocol.ClusterMembership{FailureThreshold: protocol.Duration(time.Second)},
		Election:   protocol.ClusterElection{LeaseDuration: protocol.Duration(time.Second)}}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, "leader", b.agent.IsClusterLeader)
	ch, err := b.agent.WatchCluster(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.stop(t); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("WatchCluster channel still open 5s after the agent stopped")
		}
	}
}

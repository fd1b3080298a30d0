package cluster_test

import (
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/pkg/protocol"
)

func TestTransferPolicyDefaults(t *testing.T) {
	t.Parallel()
	p := cluster.TransferPolicyOf(protocol.ClusterDefinition{Name: "x", Mode: protocol.ModeActiveActive})
	if p.Timeout != cluster.DefaultTaskTransferTimeout || p.MaxRetries != cluster.DefaultMaxTransferRetries {
		t.Fatalf("defaults: %+v", p)
	}
	d := protocol.ClusterDefinition{Name: "x", Mode: protocol.ModeActiveActive,
		Failover: protocol.ClusterFailover{TaskTransferTimeout: protocol.Duration(2 * time.Second), MaxTransferRetries: 1}}
	if p := cluster.TransferPolicyOf(d); p.Timeout != 2*time.Second || p.MaxRetries != 1 {
		t.Fatalf("set: %+v", p)
	}
}

func TestJudgeTransfer(t *testing.T) {
	t.Parallel()
	p := cluster.TransferPolicy{Timeout: time.Second, MaxRetries: 2}
	for _, c := range []struct {
		takenUp bool
		retries int
		want    cluster.TransferVerdict
	}{
		{true, 0, cluster.TransferDone},
		{true, 2, cluster.TransferDone}, // taken up on the last chance
		{false, 0, cluster.TransferRetry},
		{false, 1, cluster.TransferRetry},
		{false, 2, cluster.TransferGiveUp}, // two retries spent: the third timeout gives up
	} {
		if got := cluster.JudgeTransfer(c.takenUp, c.retries, p); got != c.want {
			t.Errorf("JudgeTransfer(%v, %d) = %d, want %d", c.takenUp, c.retries, got, c.want)
		}
	}
	if r := cluster.TransferRetryReason("c", "", 1, p); !strings.Contains(r, "none could be chosen") || !strings.Contains(r, "retry 1 of 2") {
		t.Errorf("retry reason %q", r)
	}
	if r := cluster.TransferGiveUpReason("c", "p.b", p); !strings.Contains(r, "task_transfer_timeout 1s after 2 transfer retries") {
		t.Errorf("give-up reason %q", r)
	}
}

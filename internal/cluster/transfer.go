package cluster

import (
	"fmt"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// TransferPolicy is the part of a cluster's failover policy that bounds a
// task transfer (docs/clusters.md, "Task transfer"): when a member fails,
// the supervisor moves the steps in its hands; each moved step must be
// taken up by a member (its task delivered to that member) within Timeout
// of the move, else it is moved again, at most MaxRetries times; then it
// is dead-lettered with reason transfer_timeout.
type TransferPolicy struct {
	Timeout    time.Duration
	MaxRetries int
}

// TransferPolicyOf returns the transfer policy of d, defaults filled in.
func TransferPolicyOf(d protocol.ClusterDefinition) TransferPolicy {
	f := WithDefaults(d).Failover
	return TransferPolicy{Timeout: f.TaskTransferTimeout.Std(), MaxRetries: f.MaxTransferRetries}
}

// TransferVerdict is what to do with a moved step when its transfer
// timeout has passed.
type TransferVerdict int

// Transfer verdicts.
const (
	// TransferDone: a member took the task up (or the step moved on): the
	// transfer is over; from here the step's own lease bounds it.
	TransferDone TransferVerdict = iota + 1
	// TransferRetry: nobody took it up; move it again (to another member
	// where the mode allows a choice) and wait another Timeout.
	TransferRetry
	// TransferGiveUp: nobody took it up and the retries are spent.
	TransferGiveUp
)

// JudgeTransfer decides a transfer whose timeout has passed: takenUp says
// whether a member has the task now, retries how often it was moved again
// already. Pure.
func JudgeTransfer(takenUp bool, retries int, p TransferPolicy) TransferVerdict {
	switch {
	case takenUp:
		return TransferDone
	case retries < p.MaxRetries:
		return TransferRetry
	default:
		return TransferGiveUp
	}
}

// TransferRetryReason explains a retry: member (empty: none could be
// chosen) did not take the task up within the timeout.
func TransferRetryReason(cluster, member string, retry int, p TransferPolicy) string {
	return fmt.Sprintf("cluster %s: transferred task not taken up by %s within task_transfer_timeout %s; transfer retry %d of %d",
		cluster, memberOrNone(member), p.Timeout, retry, p.MaxRetries)
}

// TransferGiveUpReason explains a give-up.
func TransferGiveUpReason(cluster, member string, p TransferPolicy) string {
	return fmt.Sprintf("cluster %s: transferred task not taken up within task_transfer_timeout %s after %d transfer retries (last: %s); "+
		"dead-lettered: replay it once the cluster can take it",
		cluster, p.Timeout, p.MaxRetries, memberOrNone(member))
}

func memberOrNone(m string) string {
	if m == "" {
		return "any member (none could be chosen)"
	}
	return "member " + m
}

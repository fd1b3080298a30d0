package scheduler

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/selection"
	"github.com/wardenhq/warden/pkg/protocol"
)

// rerouteDelay holds back a step a cluster member refused, so that a
// routing that is a moment behind the cluster's state does not spin.
const rerouteDelay = 250 * time.Millisecond

// chooseCluster picks the member of a step's cluster that takes it and the
// cluster epoch its task carries (docs/clusters.md): the leader
// (active_passive), the target's owner (sharded), or the best-scored
// healthy member (active_active, by the selector's PeekScore). The member
// must still be eligible in the selector (present, offering the action,
// not draining, with a free slot).
func (s *Scheduler) chooseCluster(st *jobstore.Step) (protocol.Presence, uint64, error) {
	d, err := s.router.Route(st.Cluster, st.Target)
	if err != nil {
		return protocol.Presence{}, 0, err
	}
	req := func(key string) selection.Request {
		pool, id, _ := strings.Cut(key, ".")
		return selection.Request{Pool: pool, Agent: id, Action: st.Action, Requires: st.Requires}
	}
	if d.Agent != "" {
		p, err := s.selector.Choose(req(d.Agent))
		if err != nil {
			return p, 0, fmt.Errorf("cluster %s: member %s: %w", st.Cluster, d.Agent, err)
		}
		return p, d.Epoch, nil
	}
	best, bestScore := "", -1.0
	var lastErr error
	// Presence loads lag a heartbeat behind, so equal scores are common:
	// start at a rotating member so that ties are spread, not piled up.
	start := int(s.clusterTurn.Add(1))
	// A step moved off a member (failed, or sitting on a transferred task
	// past task_transfer_timeout) goes to another one if any can take it.
	avoid := ""
	if st.TransferredFrom != "" && len(d.Members) > 1 {
		avoid = st.Pool + "." + st.TransferredFrom
	}
	for k := range d.Members {
		key := d.Members[(start+k)%len(d.Members)]
		if key == avoid {
			continue
		}
		// The selector's score: its load counts this scheduler's own
		// assignments since the member's heartbeat, and its health. Scored
		// from the heartbeat alone, a burst all went to the member that
		// last reported itself idle, and a degraded member ranked as a
		// healthy one.
		sc, err := s.selector.PeekScore(req(key))
		if err != nil {
			lastErr = err
			continue
		}
		if sc > bestScore {
			best, bestScore = key, sc
		}
	}
	if best == "" && avoid != "" {
		if _, err := s.selector.Peek(req(avoid)); err == nil {
			best = avoid
		}
	}
	if best == "" {
		return protocol.Presence{}, 0, fmt.Errorf("cluster %s: no member can take it: %w", st.Cluster, errors.Join(cluster.ErrNoRoute, lastErr))
	}
	p, err := s.selector.Choose(req(best))
	return p, d.Epoch, err
}

// setClusterHeaders marks a task dispatched through a cluster: the member
// runs it only under this epoch (and, sharded, owning the target).
func setClusterHeaders(h map[string][]string, st *jobstore.Step) {
	if st.Cluster == "" {
		return
	}
	h[protocol.HeaderCluster] = []string{st.Cluster}
	h[protocol.HeaderClusterEpoch] = []string{fmt.Sprint(st.ClusterEpoch)}
	if st.Target != "" {
		h[protocol.HeaderTarget] = []string{st.Target}
	}
}

package agent

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/pkg/protocol"
)

// ClusterView is this agent's picture of its cluster (docs/clusters.md):
// mode, epoch, leader, whether this agent is the leader, its role and the
// targets (shards) it serves, the cluster's status, and whether its copy of
// the leader's sync state matches the leader's.
type ClusterView = cluster.View

// ErrNoCluster is returned by the cluster methods of an agent whose
// configuration names no cluster.
var ErrNoCluster = errors.New("agent: not a cluster member (config names no cluster)")

// Sync state sections a leader's handler may write (SetClusterState).
const (
	ClusterTaskStates    = cluster.SectionTaskStates
	ClusterCachedDigests = cluster.SectionCachedDigests
)

// clusterMember is the agent's side of its cluster, set by Run when the
// configuration names one.
type clusterMember struct {
	m      *cluster.Member
	done   chan struct{}
	cancel context.CancelFunc
	fenced atomic.Uint64 // cluster tasks refused or results withheld
}

// startCluster joins the configured cluster: the member reports, campaigns
// and, while it holds the lease, leads.
func (a *Agent) startCluster(ctx context.Context) error {
	if a.cfg.Cluster == "" {
		return nil
	}
	m, err := cluster.NewMember(ctx, a.js, cluster.MemberConfig{
		Cluster: a.cfg.Cluster, Pool: a.cfg.Pool, ID: a.cfg.ID, Interval: a.cfg.HeartbeatInterval.Std(),
		StartedAt: a.startedAt, Now: a.now, Logger: a.log,
		Load:     func() (int, int) { return a.Stats().InFlight, int(a.limit.Load()) },
		Draining: func() bool { return a.draining.Load() || a.held.Load() },
	})
	if err != nil {
		return fmt.Errorf("join cluster %s: %w", a.cfg.Cluster, err)
	}
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &clusterMember{m: m, done: make(chan struct{}), cancel: cancel}
	go func() { defer close(c.done); _ = m.Run(mctx) }()
	select {
	case <-m.Ready():
	case <-time.After(setupTimeout):
		a.log.Warn().Msg("cluster keys not read yet; continuing")
	}
	a.clu.Store(c)
	a.log.Info().Str("cluster", a.cfg.Cluster).Msg("joined cluster")
	return nil
}

// stopCluster steps down and leaves.
func (a *Agent) stopCluster() {
	if c := a.clu.Load(); c != nil {
		c.cancel()
		<-c.done
	}
}

// Cluster returns this agent's view of its cluster.
func (a *Agent) Cluster() (ClusterView, error) {
	c := a.clu.Load()
	if c == nil {
		return ClusterView{}, ErrNoCluster
	}
	return c.m.View(), nil
}

// IsClusterLeader reports whether this agent provably holds its cluster's
// lease now. Check it right before any act only the leader may do.
func (a *Agent) IsClusterLeader() bool {
	v, err := a.Cluster()
	return err == nil && v.IsLeader
}

// Shards returns the targets this agent serves: its shards in a sharded
// cluster, the whole target group for an active-passive leader.
func (a *Agent) Shards() []string {
	v, _ := a.Cluster()
	return v.Targets
}

// WatchCluster returns a channel that receives the cluster view whenever it
// may have changed (leadership, epoch, shards, sync), holding only the latest
// one; it is closed when ctx ends or the agent stops.
func (a *Agent) WatchCluster(ctx context.Context) (<-chan ClusterView, error) {
	c := a.clu.Load()
	if c == nil {
		return nil, ErrNoCluster
	}
	return c.m.Watch(ctx), nil
}

// ClusterState returns this agent's copy of the leader's sync state.
func (a *Agent) ClusterState() (protocol.ClusterSync, error) {
	c := a.clu.Load()
	if c == nil {
		return protocol.ClusterSync{}, ErrNoCluster
	}
	return c.m.Sync(), nil
}

// SetClusterState sets (value "" deletes) an entry of the leader's sync
// state in section ClusterTaskStates or ClusterCachedDigests. Only the
// leader may; every member has it within one sync interval.
func (a *Agent) SetClusterState(section, key, value string) error {
	c := a.clu.Load()
	if c == nil {
		return ErrNoCluster
	}
	return c.m.SetSync(section, key, value)
}

// clusterTask reads a task's cluster headers: ok is false for a task not
// dispatched through a cluster.
func clusterTask(msg jetstream.Msg) (name string, epoch uint64, target string, ok bool) {
	h := msg.Headers()
	if h == nil || h.Get(protocol.HeaderCluster) == "" {
		return "", 0, "", false
	}
	epoch, _ = strconv.ParseUint(h.Get(protocol.HeaderClusterEpoch), 10, 64)
	return h.Get(protocol.HeaderCluster), epoch, h.Get(protocol.HeaderTarget), true
}

// clusterAdmit decides whether a task dispatched through a cluster may run
// here: under its epoch this agent must be the leader (active_passive), the
// target's owner (sharded) or a member taking work (active_active). A nil
// error means run it.
func (a *Agent) clusterAdmit(msg jetstream.Msg) error {
	name, epoch, target, ok := clusterTask(msg)
	if !ok {
		return nil
	}
	c := a.clu.Load()
	if c == nil || name != a.cfg.Cluster {
		return &rerouteError{fmt.Errorf("cluster: task for cluster %q reached an agent of cluster %q", name, a.cfg.Cluster)}
	}
	if err := c.m.Accept(epoch, target); err != nil {
		c.fenced.Add(1)
		return &rerouteError{err}
	}
	return nil
}

// rerouteError refuses a cluster task: its class (protocol.ClassReroute)
// tells the scheduler to route the step again without counting an attempt.
type rerouteError struct{ err error }

func (e *rerouteError) Error() string      { return e.err.Error() }
func (e *rerouteError) Unwrap() error      { return e.err }
func (e *rerouteError) ErrorClass() string { return protocol.ClassReroute }

// clusterFenced returns why a finished cluster task's result must be
// withheld, or nil: this agent lost the right to it meanwhile (a leader
// paused past its lease wakes up deposed), and nothing is completed under
// an epoch that is no longer this agent's. The caller hands the step back
// instead (a reroute result), so that the cluster's leader runs it now
// rather than after the step's lease (its timeout, 5 minutes by default).
func (a *Agent) clusterFenced(msg jetstream.Msg, log zerolog.Logger) error {
	name, epoch, target, ok := clusterTask(msg)
	if !ok {
		return nil
	}
	c := a.clu.Load()
	if c == nil {
		return nil
	}
	err := c.m.AcceptResult(epoch, target)
	if err == nil || name != a.cfg.Cluster {
		return nil
	}
	c.fenced.Add(1)
	log.Warn().Err(err).Uint64("cluster_epoch", epoch).Msg("cluster epoch lost while running: withholding the result, handing the step back")
	return &rerouteError{fmt.Errorf("cluster epoch lost while running (the result is withheld): %w", err)}
}

// ClusterFenced counts the cluster tasks this agent refused to run or whose
// results it withheld because their cluster epoch was no longer its own.
func (a *Agent) ClusterFenced() uint64 {
	if c := a.clu.Load(); c != nil {
		return c.fenced.Load()
	}
	return 0
}

package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Routing errors. ErrNoRoute is retriable: the cluster has no leader or no
// member that can take the step right now.
var (
	ErrUnknownCluster = errors.New("cluster: unknown cluster")
	ErrNoRoute        = errors.New("cluster: no member can take the step now")
	ErrTargetRequired = errors.New("cluster: a sharded cluster needs the step's target")
)

// Decision is where a step dispatched through a cluster goes.
type Decision struct {
	// Agent is the presence key (<pool>.<agent>) to dispatch to; empty for
	// active_active, where the caller picks among Members with its
	// health-scored selection.
	Agent string
	// Epoch is the cluster epoch the task must carry.
	Epoch uint64
	// Members are the members that may take the step (active_active: all
	// of them; otherwise the one Agent).
	Members []string
}

// Router answers Route from a watch of every cluster's state: O(1) per
// decision after a hash of the target (sharded: O(members)).
type Router struct {
	kv  jetstream.KeyValue
	log zerolog.Logger

	mu       sync.RWMutex
	states   map[string]protocol.ClusterState
	ready    chan struct{}
	onChange []func()
}

// OnChange registers f to be called (from the watch goroutine) after every
// state change. Register before Run.
func (r *Router) OnChange(f func()) { r.onChange = append(r.onChange, f) }

// NewRouter binds a router to the clusters bucket. Call Run.
func NewRouter(ctx context.Context, js jetstream.JetStream, log zerolog.Logger) (*Router, error) {
	kv, err := js.KeyValue(ctx, protocol.BucketClusters)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", protocol.BucketClusters, err)
	}
	return &Router{kv: kv, log: log, states: map[string]protocol.ClusterState{}, ready: make(chan struct{})}, nil
}

// Ready is closed once the states stored at start are loaded.
func (r *Router) Ready() <-chan struct{} { return r.ready }

// Run watches the states until ctx ends.
func (r *Router) Run(ctx context.Context) error {
	w, err := r.kv.Watch(ctx, "*.state")
	if err != nil {
		return fmt.Errorf("watch cluster states: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("cluster state watch closed")
			}
			if e == nil {
				select {
				case <-r.ready:
				default:
					close(r.ready)
				}
				continue
			}
			name, _ := protocol.ClusterOfKey(e.Key())
			r.mu.Lock()
			if e.Operation() != jetstream.KeyValuePut {
				delete(r.states, name)
			} else {
				var st protocol.ClusterState
				if json.Unmarshal(e.Value(), &st) == nil {
					r.states[name] = st
				}
			}
			r.mu.Unlock()
			for _, f := range r.onChange {
				f()
			}
		}
	}
}

// Route decides where a step addressed to cluster (and, sharded, target)
// goes and under which epoch.
func (r *Router) Route(cluster, target string) (Decision, error) {
	r.mu.RLock()
	st, ok := r.states[cluster]
	r.mu.RUnlock()
	if !ok {
		return Decision{}, fmt.Errorf("%w %q (or it has no leader yet)", ErrUnknownCluster, cluster)
	}
	return RouteIn(st, target)
}

// RouteIn is Route on one state (pure).
func RouteIn(st protocol.ClusterState, target string) (Decision, error) {
	switch st.Mode {
	case protocol.ModeActivePassive:
		if st.Leader == "" {
			return Decision{}, fmt.Errorf("%w: %s has no leader", ErrNoRoute, st.Cluster)
		}
		return Decision{Agent: st.Leader, Epoch: st.Epoch, Members: []string{st.Leader}}, nil
	case protocol.ModeSharded:
		if target == "" {
			return Decision{}, ErrTargetRequired
		}
		owner := Owner(target, st.Owners)
		if owner == "" {
			return Decision{}, fmt.Errorf("%w: %s has no shard owners", ErrNoRoute, st.Cluster)
		}
		return Decision{Agent: owner, Epoch: st.Epoch, Members: []string{owner}}, nil
	default:
		var ms []string
		for _, m := range st.Members {
			if m.Role == protocol.RoleMember {
				ms = append(ms, m.Key)
			}
		}
		if len(ms) == 0 {
			return Decision{}, fmt.Errorf("%w: %s has no healthy member", ErrNoRoute, st.Cluster)
		}
		return Decision{Epoch: st.Epoch, Members: slices.Clip(ms)}, nil
	}
}

// State returns the last state seen of a cluster.
func (r *Router) State(cluster string) (protocol.ClusterState, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	st, ok := r.states[cluster]
	return st, ok
}

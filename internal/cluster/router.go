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

	"github.com/wardenhq/warden/internal/watch"
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
	w   *watch.Watch
	log zerolog.Logger

	mu       sync.RWMutex
	states   map[string]protocol.ClusterState
	onChange []func()
}

// OnChange registers f to be called (from the watch goroutine) after every
// state change. Register before Run.
func (r *Router) OnChange(f func()) { r.onChange = append(r.onChange, f) }

// NewRouter binds a router to the states in the cluster runtime bucket.
// Call Run.
func NewRouter(ctx context.Context, js jetstream.JetStream, log zerolog.Logger) (*Router, error) {
	kv, err := js.KeyValue(ctx, protocol.BucketClusterRuntime)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", protocol.BucketClusterRuntime, err)
	}
	return &Router{w: watch.ForKV(js, kv, watch.Config{Keys: []string{"*.state"}, Logger: log}), log: log,
		states: map[string]protocol.ClusterState{}}, nil
}

// Ready is closed once the states stored at start are loaded.
func (r *Router) Ready() <-chan struct{} { return r.w.Ready() }

// Run watches the states until ctx ends (internal/watch: after a gap the
// states are read again and only the differences applied).
func (r *Router) Run(ctx context.Context) error {
	return r.w.Run(ctx, func(e watch.Event) {
		name, _ := protocol.ClusterOfKey(e.Key)
		r.mu.Lock()
		if e.Gone() {
			delete(r.states, name)
		} else {
			var st protocol.ClusterState
			if json.Unmarshal(e.Entry.Value(), &st) == nil {
				r.states[name] = st
			}
		}
		r.mu.Unlock()
		for _, f := range r.onChange {
			f()
		}
	})
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

package cluster

import (
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/watch"
	"github.com/wardenhq/warden/pkg/protocol"
)

// sight tracks whether a member can trust what its view of the member
// reports shows. "I could not see" is not "it is gone" (the supervisor's
// guard for presence, internal/supervisor/sight.go, is the same): after
// any gap (the connection dropped or came back; the watch of the cluster's
// keys saw a gap, a stall or a re-sync; or the view has only just been
// read for the first time) a report older than failure_threshold may only
// mean that its member could not write it while the server was away, or
// that this member could not see it. The view is trusted again once it
// has been fresh for one failure_threshold: every live member has then
// had the time to write a report this member saw. Until then the leader
// takes nobody's work away for not reporting (holdUnseen).
type sight struct {
	nc *nats.Conn

	mu         sync.Mutex
	view       *watch.Watch // the watch of the cluster's keys; nil before it starts
	read       time.Time    // when its last full read (first or re-sync) was reported
	resyncs    int          // the view's re-syncs when read was taken
	reconnects uint64       // the connection's reconnects when last polled
	gap        time.Time    // when polling last found the connection down or reconnected
}

func newSight(nc *nats.Conn) *sight {
	return &sight{nc: nc, reconnects: nc.Stats().Reconnects}
}

// watching starts following a new watch: nothing is trusted before its
// first full read.
func (s *sight) watching(w *watch.Watch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.view, s.read, s.resyncs = w, time.Time{}, 0
}

// synced records a full read of the view (its Synced callback) at now.
func (s *sight) synced(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.read = now
	if s.view != nil {
		s.resyncs = s.view.Status().Resyncs
	}
}

// poll notices a lost or re-established connection at now.
func (s *sight) poll(now time.Time) {
	connected := s.nc.Status() == nats.CONNECTED
	r := s.nc.Stats().Reconnects
	s.mu.Lock()
	defer s.mu.Unlock()
	if !connected || r != s.reconnects {
		s.reconnects, s.gap = r, now
	}
}

// clear reports whether the view's silence can be trusted at now: the view
// is fresh, and its last full read and the last connection gap are at
// least d (the failure threshold) before now.
func (s *sight) clear(now time.Time, d time.Duration) bool {
	s.poll(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.view == nil || s.read.IsZero() {
		return false
	}
	// A re-sync whose Synced callback has not run yet has already
	// replaced the reports with what it read: its read is not dated yet.
	if st := s.view.Status(); !st.Fresh || st.Resyncs != s.resyncs {
		return false
	}
	since := s.read
	if s.gap.After(since) {
		since = s.gap
	}
	return now.Sub(since) >= d
}

// holdUnseen is what the leader decides from while its sight is not
// clear: every member the previous state had taking part (any role but
// offline) whose report is stale or missing counts as alive, Unseen, so
// that it keeps its role, its shards and its place. A member that reported
// within the threshold is judged on its report as always (draining, health
// failed, a newcomer), and one already offline stays so.
func holdUnseen(prev protocol.ClusterState, members map[string]Observed) map[string]Observed {
	out := maps.Clone(members)
	for _, pm := range prev.Members {
		if pm.Role == protocol.RoleOffline {
			continue
		}
		o, ok := out[pm.Key]
		if ok && o.Alive {
			continue
		}
		if !ok {
			// Its report is gone from the bucket (expired during a long
			// outage): what the previous state knew of it stands in.
			pool, id, _ := strings.Cut(pm.Key, ".")
			o.Report = protocol.ClusterMemberReport{Cluster: prev.Cluster, Pool: pool, ID: id,
				StartedAt: pm.StartedAt, Digest: pm.Digest}
		}
		o.Alive, o.Unseen = true, true
		out[pm.Key] = o
	}
	return out
}

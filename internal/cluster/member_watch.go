package cluster

import (
	"context"
	"encoding/json"
	"time"

	"github.com/wardenhq/warden/internal/watch"
	"github.com/wardenhq/warden/pkg/protocol"
)

// The member's watches: its cluster's keys, its lease, its health.

// watchDefinition follows the cluster's definition (warden_clusters).
func (m *Member) watchDefinition(ctx context.Context) error {
	w := watch.ForKV(m.js, m.store.defs, watch.Config{Keys: []string{m.cfg.Cluster}, Logger: m.log,
		Synced: func(bool) { m.synced(&m.defSynced) }})
	return w.Run(ctx, m.applyAndWake)
}

// watchCluster follows every key the cluster's members write
// (warden_cluster_runtime; internal/watch: after a gap the keys are read
// again and only the differences reported).
func (m *Member) watchCluster(ctx context.Context) error {
	w := watch.ForKV(m.js, m.store.rt, watch.Config{Keys: []string{m.cfg.Cluster + ".>"}, Logger: m.log,
		Synced: func(bool) {
			m.sight.synced(m.cfg.Now())
			m.synced(&m.runtimeSynced)
		}})
	m.sight.watching(w)
	return w.Run(ctx, m.applyAndWake)
}

// synced records a completed read of one of the two watches; the member
// is ready once both have read their keys.
func (m *Member) synced(part *bool) {
	m.mu.Lock()
	*part = true
	both := m.defSynced && m.runtimeSynced
	m.mu.Unlock()
	if both {
		select {
		case <-m.ready:
		default:
			close(m.ready)
		}
	}
	m.notify()
}

func (m *Member) applyAndWake(e watch.Event) {
	m.apply(e)
	if !e.Initial {
		m.notify()
		m.poke()
	}
}

// apply records one change of the cluster's keys.
func (m *Member) apply(e watch.Event) {
	_, rest := protocol.ClusterOfKey(e.Key)
	put := !e.Gone()
	at := m.cfg.Now()
	if put && (e.Initial || e.Resync) && e.Entry.Created().Before(at) {
		// Stored before we looked (or while we could not see): it is at
		// least that old.
		at = e.Entry.Created()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case rest == "":
		if !put {
			m.def = nil
			return
		}
		d, err := Decode(e.Entry.Value())
		if ld := d.Election.LeaseDuration.Std(); err == nil && ld > minLease && ld%time.Second != 0 {
			// Stored before fractions were refused (or by hand): the
			// server would keep the lease only the whole seconds, so that
			// is the lease_duration, not a reason to leave the cluster.
			d.Election.LeaseDuration = protocol.Duration(ld.Truncate(time.Second))
			m.log.Warn().Stringer("lease_duration", ld).Stringer("used", d.Election.LeaseDuration).
				Msg("lease_duration is not a whole number of seconds: using the whole seconds")
		}
		if err == nil {
			err = Validate(d)
		}
		if err != nil {
			m.log.Warn().Err(err).Msg("ignoring an invalid cluster definition")
			return
		}
		m.def = &d
		if got := m.lease.setTTL(d.Election.LeaseDuration.Std()); got < d.Election.LeaseDuration.Std() {
			m.log.Warn().Stringer("lease_duration", d.Election.LeaseDuration).Stringer("used", got).
				Msg("lease_duration is above the leases bucket's TTL (the supervisor's lease_ttl): using what the bucket keeps")
		}
	case rest == "state":
		if !put {
			m.state, m.stateRev = protocol.ClusterState{}, 0
			return
		}
		var st protocol.ClusterState
		if json.Unmarshal(e.Entry.Value(), &st) == nil && e.Entry.Revision() > m.stateRev {
			m.setStateLocked(st, e.Entry.Revision())
		}
	case rest == "sync":
		if put {
			m.syncRev = max(m.syncRev, e.Entry.Revision())
			var s protocol.ClusterSync
			if json.Unmarshal(e.Entry.Value(), &s) == nil {
				m.applySyncLocked(s)
			}
		}
	case len(rest) > 7 && rest[:7] == "member.":
		k := rest[7:]
		if !put {
			delete(m.reports, k)
			return
		}
		var r protocol.ClusterMemberReport
		if json.Unmarshal(e.Entry.Value(), &r) == nil && r.Key() == k {
			m.reports[k] = seen{report: r, at: at}
		}
	case len(rest) > 4 && rest[:4] == "req.":
		id := rest[4:]
		if !put {
			delete(m.requests, id)
			return
		}
		var r protocol.ClusterRequest
		if json.Unmarshal(e.Entry.Value(), &r) == nil {
			r.ID = id
			m.requests[id] = pendingRequest{ClusterRequest: r, rev: e.Entry.Revision()}
		}
	}
}

// applySyncLocked brings this member's copy to the leader's: it applies the
// difference, so only what changed is touched.
func (m *Member) applySyncLocked(s protocol.ClusterSync) {
	if s.Epoch < m.state.Epoch {
		// Written under an epoch older than the state's: a deposed leader's
		// late write (the sync is a plain put). The leader sees the foreign
		// write and publishes its own again.
		m.log.Debug().Uint64("sync_epoch", s.Epoch).Uint64("epoch", m.state.Epoch).Str("from", s.Leader).Msg("ignoring a stale sync state")
		return
	}
	changes := Diff(m.copy, s)
	next := Apply(m.copy, changes)
	next.Leader, next.Epoch, next.CapturedAt = s.Leader, s.Epoch, s.CapturedAt
	if len(changes) > 0 {
		m.log.Debug().Int("changes", len(changes)).Str("digest", next.Digest).Msg("applied the leader's state")
	}
	m.copy = next
}

// resync re-reads the sync state: the backstop that makes a member that
// missed updates (paused, cut off) converge within one sync interval.
func (m *Member) resync(ctx context.Context) {
	s, err := m.store.Sync(ctx, m.cfg.Cluster)
	if err != nil {
		return
	}
	m.mu.Lock()
	before := m.copy.Digest
	m.applySyncLocked(s)
	changed := before != m.copy.Digest
	m.mu.Unlock()
	if changed {
		m.notify()
	}
}

// watchLease follows the holder of the cluster's lease.
func (m *Member) watchLease(ctx context.Context) error {
	w := watch.ForKV(m.js, m.leases, watch.Config{Keys: []string{m.lease.key}, Logger: m.log})
	return w.Run(ctx, func(e watch.Event) {
		holder := ""
		if !e.Gone() {
			var v struct {
				ID string `json:"id"`
			}
			_ = json.Unmarshal(e.Entry.Value(), &v)
			holder = v.ID
		}
		m.mu.Lock()
		m.holder = holder
		m.mu.Unlock()
		m.notify()
		m.poke()
	})
}

// watchHealth follows the supervisor's assessment of this agent, if any.
func (m *Member) watchHealth(ctx context.Context) error {
	w, err := watch.New(ctx, m.js, protocol.BucketHealth, watch.Config{Keys: []string{m.key}, Logger: m.log})
	if err != nil {
		<-ctx.Done() // no assessments in this deployment
		return nil
	}
	return w.Run(ctx, func(e watch.Event) {
		level := ""
		if !e.Gone() {
			var r struct {
				Level json.RawMessage `json:"level"`
			}
			_ = json.Unmarshal(e.Entry.Value(), &r)
			level = decodeLevel(r.Level)
		}
		m.mu.Lock()
		m.health = level
		m.mu.Unlock()
		m.poke()
	})
}

// decodeLevel reads a health level written as a name or a number (5 is
// failed in internal/health).
func decodeLevel(b json.RawMessage) string {
	var s string
	if json.Unmarshal(b, &s) == nil {
		return s
	}
	var n int
	if json.Unmarshal(b, &n) == nil && n == 5 {
		return "failed"
	}
	return ""
}

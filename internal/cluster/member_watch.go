package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// The member's watches: its cluster's keys, its lease, its health.

// watchCluster follows every key of the cluster.
func (m *Member) watchCluster(ctx context.Context) error {
	name := m.cfg.Cluster
	w, err := m.store.kv.WatchFiltered(ctx, []string{name, name + ".>"})
	if err != nil {
		return fmt.Errorf("watch cluster %s: %w", name, err)
	}
	defer func() { _ = w.Stop() }()
	initial := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch closed")
			}
			if e == nil {
				if initial {
					initial = false
					select {
					case <-m.ready:
					default:
						close(m.ready)
					}
				}
				m.notify()
				continue
			}
			m.apply(e, initial)
			if !initial {
				m.notify()
				m.poke()
			}
		}
	}
}

// apply records one entry of the cluster's keys.
func (m *Member) apply(e jetstream.KeyValueEntry, initial bool) {
	_, rest := protocol.ClusterOfKey(e.Key())
	put := e.Operation() == jetstream.KeyValuePut
	at := m.cfg.Now()
	if initial && e.Created().Before(at) {
		// Stored before we looked: it is at least that old.
		at = e.Created()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case rest == "":
		if !put {
			m.def = nil
			return
		}
		d, err := Decode(e.Value())
		if err != nil || Validate(d) != nil {
			m.log.Warn().Err(err).Msg("ignoring an invalid cluster definition")
			return
		}
		m.def = &d
		m.lease.setTTL(d.Election.LeaseDuration.Std())
	case rest == "state":
		if !put {
			m.state, m.stateRev = protocol.ClusterState{}, 0
			return
		}
		var st protocol.ClusterState
		if json.Unmarshal(e.Value(), &st) == nil && e.Revision() > m.stateRev {
			m.state, m.stateRev = st, e.Revision()
		}
	case rest == "sync":
		if put {
			var s protocol.ClusterSync
			if json.Unmarshal(e.Value(), &s) == nil {
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
		if json.Unmarshal(e.Value(), &r) == nil && r.Key() == k {
			m.reports[k] = seen{report: r, at: at}
		}
	case len(rest) > 4 && rest[:4] == "req.":
		id := rest[4:]
		if !put {
			delete(m.requests, id)
			return
		}
		var r protocol.ClusterRequest
		if json.Unmarshal(e.Value(), &r) == nil {
			r.ID = id
			m.requests[id] = r
		}
	}
}

// applySyncLocked brings this member's copy to the leader's: it applies the
// difference, so only what changed is touched.
func (m *Member) applySyncLocked(s protocol.ClusterSync) {
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

func (m *Member) watchLease(ctx context.Context) error {
	w, err := m.leases.Watch(ctx, m.lease.key)
	if err != nil {
		return fmt.Errorf("watch lease: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("lease watch closed")
			}
			if e == nil {
				continue
			}
			holder := ""
			if e.Operation() == jetstream.KeyValuePut {
				var v struct {
					ID string `json:"id"`
				}
				_ = json.Unmarshal(e.Value(), &v)
				holder = v.ID
			}
			m.mu.Lock()
			m.holder = holder
			m.mu.Unlock()
			m.notify()
			m.poke()
		}
	}
}

// watchHealth follows the supervisor's assessment of this agent, if any.
func (m *Member) watchHealth(ctx context.Context) error {
	kv, err := m.js.KeyValue(ctx, protocol.BucketHealth)
	if err != nil {
		<-ctx.Done() // no assessments in this deployment
		return nil
	}
	w, err := kv.Watch(ctx, m.key)
	if err != nil {
		return fmt.Errorf("watch health: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("health watch closed")
			}
			if e == nil {
				continue
			}
			level := ""
			if e.Operation() == jetstream.KeyValuePut {
				var r struct {
					Level json.RawMessage `json:"level"`
				}
				_ = json.Unmarshal(e.Value(), &r)
				level = decodeLevel(r.Level)
			}
			m.mu.Lock()
			m.health = level
			m.mu.Unlock()
			m.poke()
		}
	}
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

package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/wardenhq/warden/pkg/protocol"
)

// What a member tells its handlers: the view, changes to it, and whether a
// task or a result may go ahead.

// View returns the member's current picture of its cluster.
func (m *Member) View() View {
	epoch, leading := m.lease.held()
	m.mu.Lock()
	defer m.mu.Unlock()
	v := View{Cluster: m.cfg.Cluster, Defined: m.def != nil, IsLeader: leading && m.def != nil,
		Digest: m.copy.Digest, Status: m.state.Status, Leader: m.state.Leader, Epoch: m.state.Epoch}
	if m.def != nil {
		v.Mode = m.def.Mode
	}
	if mem, ok := m.state.Member(m.key); ok {
		v.Role, v.Targets = mem.Role, slices.Clone(mem.Targets)
	}
	switch {
	case v.IsLeader && v.Mode == protocol.ModeActivePassive:
		v.Role, v.Leader, v.Epoch = protocol.RoleLeader, m.key, m.termEpochLocked(epoch)
		if m.def != nil {
			v.Targets = slices.Clone(m.def.TargetGroup.Targets)
		}
	case !v.IsLeader && v.Role == protocol.RoleLeader:
		// The state still names us but the lease is gone: we lead nothing.
		v.Role, v.Targets = protocol.RoleStandby, nil
	}
	v.InSync = m.state.SyncDigest != "" && m.state.SyncDigest == m.copy.Digest
	return v
}

// Sync returns this member's copy of the leader's sync state.
func (m *Member) Sync() protocol.ClusterSync {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.copy
}

// Watch returns a channel that receives the view whenever it may have
// changed (the latest view only, never blocking the member), until ctx ends
// or the member stops (Run returns); then it is closed.
func (m *Member) Watch(ctx context.Context) <-chan View {
	ch := make(chan View, 1)
	m.mu.Lock()
	select {
	case <-m.stopped:
		m.mu.Unlock()
		close(ch)
		return ch
	default:
	}
	m.watchers = append(m.watchers, ch)
	m.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-m.stopped: // Run closed ch already
			return
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		for i, w := range m.watchers {
			if w == ch {
				m.watchers = slices.Delete(m.watchers, i, i+1)
				close(ch)
				return
			}
		}
	}()
	m.notify()
	return ch
}

// termEpochLocked is the epoch of this member's active-passive term under
// lease epoch le: the lease's revision, unless the state this member wrote
// for the term says more (epochs never decrease, so after a mode change the
// term's epoch may be above the lease's revision; see Compute).
func (m *Member) termEpochLocked(le uint64) uint64 {
	st := m.state
	if st.Mode == protocol.ModeActivePassive && st.Leader == m.key && st.LeaseEpoch == le && st.Epoch > le {
		return st.Epoch
	}
	return le
}

// resignLocked remembers an epoch this member gave up of its own accord.
func (m *Member) resignLocked(epoch uint64) {
	if epoch == 0 || slices.Contains(m.resigned, epoch) {
		return
	}
	m.resigned = append(m.resigned, epoch)
	if len(m.resigned) > maxResigned {
		m.resigned = slices.Delete(m.resigned, 0, len(m.resigned)-maxResigned)
	}
}

func (m *Member) notify() {
	v := m.View()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ch := range m.watchers {
		select {
		case <-ch: // drop the stale view
		default:
		}
		select {
		case ch <- v:
		default:
		}
	}
}

// Accept decides whether this member may run a task dispatched through the
// cluster under epoch for target (sharded). A nil error means yes.
func (m *Member) Accept(epoch uint64, target string) error {
	v := m.View()
	if !v.Defined {
		return ErrNotDefined
	}
	switch v.Mode {
	case protocol.ModeActivePassive:
		// View read the lease and the term's epoch once already.
		if !v.IsLeader {
			return ErrNotLeader
		}
		if epoch != v.Epoch {
			return fmt.Errorf("%w: task epoch %d, leader epoch %d", ErrStaleEpoch, epoch, v.Epoch)
		}
		return nil
	case protocol.ModeSharded:
		m.mu.Lock()
		owners, sepoch := m.state.Owners, m.state.Epoch
		m.mu.Unlock()
		if epoch > sepoch {
			return fmt.Errorf("%w: task epoch %d is ahead of this member's %d", ErrStaleEpoch, epoch, sepoch)
		}
		if Owner(target, owners) != m.key {
			return fmt.Errorf("%w: %s (epoch %d)", ErrNotOwner, target, sepoch)
		}
		return nil
	default:
		if epoch > v.Epoch {
			return fmt.Errorf("%w: task epoch %d is ahead of this member's %d", ErrStaleEpoch, epoch, v.Epoch)
		}
		if v.Role != protocol.RoleMember {
			return fmt.Errorf("%w (role %s)", ErrNotAccepted, v.Role)
		}
		return nil
	}
}

// AcceptResult decides whether a finished cluster task's result may be
// reported: as Accept, except that an active-passive leader that stepped
// down of its own accord (drained, handed off, stopping) still reports the
// tasks it ran under the epochs it gave up, even after it leads again under
// a new one. A leader that lost its lease (paused, cut off) reports nothing
// under the old epoch.
func (m *Member) AcceptResult(epoch uint64, target string) error {
	err := m.Accept(epoch, target)
	if err == nil || epoch == 0 {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if slices.Contains(m.resigned, epoch) {
		return nil
	}
	// Draining takes a member out of the work (offline, its shards moved)
	// while its tasks still run: it reports those it was given under the
	// epoch they carry, as a resigned leader does. A member that lost its
	// place otherwise (silent, failed) does not.
	if m.cfg.Draining() && m.tookLocked(epoch, target) {
		return nil
	}
	return err
}

// setStateLocked follows a newer state, remembering the epochs this member
// took work under.
func (m *Member) setStateLocked(st protocol.ClusterState, rev uint64) {
	m.state, m.stateRev = st, rev
	m.epochSeen = max(m.epochSeen, st.Epoch)
	if st.Epoch == 0 || st.Mode == protocol.ModeActivePassive {
		return
	}
	if mem, ok := st.Member(m.key); !ok || mem.Role != protocol.RoleMember {
		return
	}
	if m.took == nil {
		m.took = map[uint64][]string{}
	}
	var owners []string
	if st.Mode == protocol.ModeSharded {
		owners = slices.Clone(st.Owners)
	}
	m.took[st.Epoch] = owners
	for len(m.took) > maxResigned {
		delete(m.took, slices.Min(slices.Collect(maps.Keys(m.took))))
	}
}

// tookLocked reports whether this member was given work for target under
// epoch: it was a member taking work then (active_active) or the target's
// owner (sharded).
func (m *Member) tookLocked(epoch uint64, target string) bool {
	owners, ok := m.took[epoch]
	switch {
	case !ok:
		return false
	case owners == nil: // active_active
		return true
	default:
		return Owner(target, owners) == m.key
	}
}

// SetSync sets (or, with value "", deletes) an entry of the sync state's
// task_states or cached_digests section. Only the leader may; members get
// the change within one sync interval.
func (m *Member) SetSync(section, key, value string) error {
	if _, ok := m.lease.held(); !ok {
		return ErrNotLeader
	}
	if section != SectionTaskStates && section != SectionCachedDigests {
		return fmt.Errorf("cluster: section %q is not writable (task_states or cached_digests)", section)
	}
	m.mu.Lock()
	m.leaderSync = Apply(m.leaderSync, []Change{{Section: section, Key: key, Value: value, Delete: value == ""}})
	m.mu.Unlock()
	m.poke()
	return nil
}

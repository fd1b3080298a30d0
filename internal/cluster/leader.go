package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// eligible reports whether this member may lead now, and why not.
func (m *Member) eligibleLocked() (bool, string) {
	switch {
	case m.def == nil:
		return false, "cluster not defined"
	case m.cfg.Draining():
		return false, "draining"
	case m.health == "failed":
		return false, "health failed"
	case m.cfg.Now().Before(m.sitOut):
		return false, "handed leadership off"
	}
	if mem, ok := m.state.Member(m.key); ok && (mem.Role == protocol.RoleRefused || mem.Role == protocol.RoleExcluded) {
		return false, mem.Role
	}
	return true, ""
}

// alive returns the reports seen within the failure threshold, with this
// member's own always included.
func (m *Member) aliveLocked() map[string]Observed {
	threshold := DefaultFailureThreshold
	if m.def != nil {
		threshold = m.def.Membership.FailureThreshold.Std()
	}
	now := m.cfg.Now()
	out := map[string]Observed{}
	for k, s := range m.reports {
		out[k] = Observed{Report: s.report, Alive: now.Sub(s.at) < threshold}
	}
	self := out[m.key]
	in, mx := m.cfg.Load()
	self.Report.Cluster, self.Report.Pool, self.Report.ID = m.cfg.Cluster, m.cfg.Pool, m.cfg.ID
	self.Report.InFlight, self.Report.MaxConcurrent, self.Report.StartedAt = in, mx, m.cfg.StartedAt
	self.Report.Draining, self.Report.Health, self.Report.Digest = m.cfg.Draining(), m.health, m.copy.Digest
	self.Alive = true
	out[m.key] = self
	return out
}

// rankLocked is this member's place in the election order (-1: not a
// candidate).
func (m *Member) rankLocked() int {
	var reps []protocol.ClusterMemberReport
	for _, o := range m.aliveLocked() {
		if o.Alive {
			reps = append(reps, o.Report)
		}
	}
	sort.Slice(reps, func(i, j int) bool { return reps[i].Key() < reps[j].Key() })
	order := ElectionOrder(Candidates(m.state, reps), m.def.Failover.SelectionStrategy, m.state.Leader, m.state.Handoff)
	return Rank(order, m.key)
}

// electionLoop campaigns whenever the lease is free and this member is
// eligible, waiting its rank's stagger first so the preferred candidate
// wins; it leads while it holds the lease.
func (m *Member) electionLoop(ctx context.Context) {
	tick := time.NewTicker(m.cfg.Stagger)
	defer tick.Stop()
	var lastCheck time.Time
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-m.wake:
		}
		m.mu.Lock()
		ok, _ := m.eligibleLocked()
		holder := m.holder
		rank := -1
		if ok {
			rank = m.rankLocked()
		}
		lease := DefaultLeaseDuration
		if m.def != nil {
			lease = m.def.Election.LeaseDuration.Std()
		}
		m.mu.Unlock()
		if rank < 0 {
			continue
		}
		// The watch says who holds the lease; a Get now and then covers a
		// missed expiry marker.
		if holder != "" && m.cfg.Now().Sub(lastCheck) < lease/2 {
			continue
		}
		lastCheck = m.cfg.Now()
		if _, err := m.leases.Get(ctx, m.lease.key); err == nil {
			continue
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if rank > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(rank) * m.cfg.Stagger):
			}
		}
		won, err := m.lease.acquire(ctx)
		if err != nil {
			if ctx.Err() == nil {
				m.log.Warn().Err(err).Msg("campaign failed")
			}
			continue
		}
		if !won {
			continue
		}
		m.lead(ctx)
	}
}

// lead runs while this member holds the lease: it renews the lease,
// computes and writes the state and the sync state, and handles requests.
func (m *Member) lead(ctx context.Context) {
	epoch, _ := m.lease.held()
	log := m.log.With().Uint64("lease_epoch", epoch).Logger()
	log.Info().Msg("cluster leader")
	m.resigned.Store(0)
	m.notify()
	// Stepping down of our own accord (drain, handoff, health, shutdown)
	// lets the tasks already run under this epoch report; being deposed
	// (the lease lost) does not.
	voluntary := true
	defer func() {
		if voluntary {
			m.resigned.Store(epoch)
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		m.lease.release(rctx)
		cancel()
		m.notify()
		log.Info().Msg("stepped down")
	}()
	ttl := m.lease.getTTL()
	renew := time.NewTicker(ttl / 3)
	defer renew.Stop()
	eval := time.NewTicker(min(m.cfg.Interval, 250*time.Millisecond))
	defer eval.Stop()
	var published string // digest of the last sync state written
	for {
		if _, ok := m.lease.held(); !ok {
			voluntary = false
			log.Warn().Msg("lease expired without renewal: deposed")
			return
		}
		m.mu.Lock()
		ok, why := m.eligibleLocked()
		m.mu.Unlock()
		if !ok {
			log.Info().Str("reason", why).Msg("no longer eligible to lead")
			// Say why (draining, health) before the lease goes, so the
			// next leader's failover event can.
			m.writeReport(ctx)
			return
		}
		if handoff := m.step(ctx, epoch, &published); handoff {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-renew.C:
			rctx, cancel := context.WithTimeout(ctx, ttl/3)
			err := m.lease.renew(rctx)
			cancel()
			if err != nil {
				voluntary = false
				log.Warn().Err(err).Msg("lease renewal failed: deposed")
				return
			}
		case <-eval.C:
		case <-m.wake:
		}
	}
}

// step is one round of the leader's work. It returns true when the leader
// hands leadership off (manual failover).
func (m *Member) step(ctx context.Context, epoch uint64, published *string) bool {
	m.mu.Lock()
	if m.def == nil { // deleted meanwhile: lead() steps down next round
		m.mu.Unlock()
		return false
	}
	def := *m.def
	prev, prevRev := m.state, m.stateRev
	members := m.aliveLocked()
	reqs := make([]protocol.ClusterRequest, 0, len(m.requests))
	for _, r := range m.requests {
		reqs = append(reqs, r)
	}
	m.mu.Unlock()
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].RequestedAt.Before(reqs[j].RequestedAt) })

	in := Input{Def: def, Prev: prev, Members: members, Leader: m.key, LeaseEpoch: epoch, Now: m.cfg.Now()}
	handoff := ""
	for _, r := range reqs {
		switch r.Op {
		case protocol.RequestRebalance:
			in.Rebalance = true
		case protocol.RequestFailover:
			if def.Mode == protocol.ModeActivePassive && (r.From == "" || r.From == m.key) {
				handoff = r.To
				if handoff == "" {
					handoff = m.bestStandby(prev, members)
				}
			} else if r.From != "" && r.From != m.key || def.Mode != protocol.ModeActivePassive {
				from := r.From
				if from == "" {
					from = m.key
				}
				in.Exclude = append(in.Exclude, from)
			}
		}
	}

	// The sync state follows the decision: assigned targets come from it.
	next, evs := Compute(in)
	m.mu.Lock()
	sync := m.leaderSync
	m.mu.Unlock()
	sync.AssignedTargets = map[string]string{}
	for _, mem := range next.Members {
		for _, t := range mem.Targets {
			sync.AssignedTargets[t] = mem.Key
		}
	}
	if def.Mode == protocol.ModeActivePassive {
		for _, t := range def.TargetGroup.Targets {
			sync.AssignedTargets[t] = m.key
		}
	}
	sync.Configuration = maps.Clone(def.Config)
	sync.Digest = Digest(sync)
	sync.Leader, sync.Epoch = m.key, next.Epoch
	next.SyncDigest = sync.Digest
	if handoff != "" && handoff != m.key {
		next.Handoff = handoff
	}

	if sync.Digest != *published {
		sync.CapturedAt = m.cfg.Now().UTC()
		b, _ := json.Marshal(sync)
		if _, ok := m.lease.held(); ok {
			if _, err := m.store.kv.Put(ctx, protocol.ClusterSyncKey(def.Name), b); err == nil {
				*published = sync.Digest
			}
		}
	}
	if prevRev != 0 && Same(prev, next) && len(reqs) == 0 {
		return false
	}
	b, _ := json.Marshal(next)
	if _, ok := m.lease.held(); !ok {
		return false
	}
	var rev uint64
	var err error
	if prevRev == 0 {
		rev, err = m.store.kv.Create(ctx, protocol.ClusterStateKey(def.Name), b)
		if errors.Is(err, jetstream.ErrKeyExists) {
			// A state exists that we have not seen yet: read it first.
			if st, r, gerr := m.store.State(ctx, def.Name); gerr == nil {
				m.mu.Lock()
				if r > m.stateRev {
					m.state, m.stateRev = st, r
				}
				m.mu.Unlock()
			}
			return false
		}
	} else {
		rev, err = m.store.kv.Update(ctx, protocol.ClusterStateKey(def.Name), b, prevRev)
	}
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn().Err(err).Msg("state not written (changed meanwhile?); retrying")
		}
		return false
	}
	m.mu.Lock()
	if rev > m.stateRev {
		m.state, m.stateRev = next, rev
	}
	m.mu.Unlock()
	for _, e := range evs {
		if err := m.store.events.Publish(ctx, e); err != nil {
			m.log.Warn().Err(err).Str("kind", string(e.Kind)).Msg("cluster event not published")
		}
		m.log.Info().Str("kind", string(e.Kind)).Str("agent", e.Agent).Str("reason", e.Reason).Interface("data", e.Data).Msg("cluster event")
	}
	for _, r := range reqs {
		_ = m.store.events.Publish(ctx, protocol.Event{Kind: protocol.EventClusterRequest, ID: r.ID, Reason: r.Reason,
			Data: map[string]string{"cluster": def.Name, "op": r.Op, "from": r.From, "to": r.To, "handled_by": m.key}})
		_ = m.store.kv.Delete(ctx, protocol.ClusterRequestKey(def.Name, r.ID))
		m.mu.Lock()
		delete(m.requests, r.ID)
		m.mu.Unlock()
	}
	m.notify()
	if next.Handoff != "" {
		m.mu.Lock()
		m.sitOut = m.cfg.Now().Add(2 * def.Election.LeaseDuration.Std())
		m.mu.Unlock()
		m.log.Info().Str("to", next.Handoff).Msg("handing leadership off")
		return true
	}
	return false
}

// bestStandby is who a manual failover without --to hands off to.
func (m *Member) bestStandby(prev protocol.ClusterState, members map[string]Observed) string {
	var reps []protocol.ClusterMemberReport
	for k, o := range members {
		if o.Alive && k != m.key {
			reps = append(reps, o.Report)
		}
	}
	sort.Slice(reps, func(i, j int) bool { return reps[i].Key() < reps[j].Key() })
	order := ElectionOrder(Candidates(prev, reps), protocol.StrategyStandby, prev.Leader, "")
	if len(order) == 0 {
		return ""
	}
	return order[0]
}

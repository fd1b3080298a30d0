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
	"github.com/wardenhq/warden/streams"
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
	// Stepping down of our own accord (drain, handoff, health, shutdown)
	// lets the tasks already run under this epoch report; being deposed
	// (the lease lost) does not.
	voluntary := true
	defer func() {
		if voluntary {
			m.mu.Lock()
			// Only an active-passive leader took tasks under its term; in
			// the other modes it coordinates, and its lease epoch may equal
			// an epoch of the shards (max(prev+1, lease)), which must stay
			// fenced by ownership.
			if m.state.Mode == protocol.ModeActivePassive || m.def != nil && m.def.Mode == protocol.ModeActivePassive {
				m.resignLocked(m.termEpochLocked(epoch))
			}
			m.mu.Unlock()
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		m.lease.release(rctx)
		cancel()
		m.notify()
		log.Info().Msg("stepped down")
	}()
	// The lease is renewed on its own goroutine: a slow step() (a stalled
	// events stream) must not hold the renewal back past the lease.
	lctx, stop := context.WithCancel(ctx)
	lost := make(chan error, 1)
	renewing := make(chan struct{})
	go func() { defer close(renewing); m.renewLoop(lctx, lost) }()
	defer func() { stop(); <-renewing }() // before the release above
	m.adoptSync(lctx)
	m.notify()
	eval := time.NewTicker(min(m.cfg.Interval, 250*time.Millisecond))
	defer eval.Stop()
	var pub published
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
		if handoff := m.step(lctx, epoch, &pub); handoff {
			return
		}
		select {
		case <-ctx.Done():
			return
		case err := <-lost:
			voluntary = false
			log.Warn().Err(err).Msg("lease renewal failed: deposed")
			return
		case <-eval.C:
		case <-m.wake:
		}
	}
}

// renewLoop renews the lease every third of its TTL until ctx ends, and
// reports a failed renewal on lost. The interval is taken afresh after
// every renewal, so a changed lease_duration applies from the next one;
// after each renewal the leases bucket's max age is read again (one
// stream info, well inside the lease), so a lowered one cuts the hold at
// once and the TTL from the next renewal.
func (m *Member) renewLoop(ctx context.Context, lost chan<- error) {
	t := time.NewTimer(m.lease.renewEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		every := m.lease.renewEvery()
		rctx, cancel := context.WithTimeout(ctx, every)
		err := m.lease.renew(rctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				lost <- err
			}
			return
		}
		rctx, cancel = context.WithTimeout(ctx, every/4)
		before, after, err := m.lease.recap(rctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			m.log.Debug().Err(err).Msg("leases bucket's max age not read again; keeping the last one")
		case after != before:
			m.log.Warn().Stringer("was", before).Stringer("now", after).
				Msg("the leases bucket's max age (the supervisor's lease_ttl) changed: the lease lives as long as it allows")
		}
		t.Reset(m.lease.renewEvery())
	}
}

// adoptSync starts a term from the sync state as published, so that a new
// leader carries on the task_states and cached_digests its predecessor
// wrote (members would delete whatever it left out) and a former leader
// does not bring back what it published in an earlier term.
func (m *Member) adoptSync(ctx context.Context) {
	m.mu.Lock()
	before := m.leaderSync
	m.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, m.lease.renewEvery())
	s, err := m.store.Sync(rctx, m.cfg.Cluster)
	cancel()
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case err == nil:
	case errors.Is(err, ErrNotFound): // nothing published yet (or the cluster was redefined)
		s = protocol.ClusterSync{}
	default: // unreadable now: this member's copy is the newest it saw
		m.log.Warn().Err(err).Msg("sync state not read; starting from this member's copy")
		s = m.copy
	}
	// SetSync may already have run (it is allowed once the lease is held):
	// keep those changes on top.
	m.leaderSync = Apply(s, Diff(before, m.leaderSync))
}

// published is what a leader last wrote to <name>.sync in this term.
type published struct {
	digest string
	epoch  uint64
	rev    uint64
}

// step is one round of the leader's work. It returns true when the leader
// hands leadership off (manual failover).
func (m *Member) step(ctx context.Context, epoch uint64, pub *published) bool {
	m.mu.Lock()
	if m.def == nil { // deleted meanwhile: lead() steps down next round
		m.mu.Unlock()
		return false
	}
	def := *m.def
	prev, prevRev := m.state, m.stateRev
	members := m.aliveLocked()
	reqs := make([]pendingRequest, 0, len(m.requests))
	for _, r := range m.requests {
		reqs = append(reqs, r)
	}
	m.mu.Unlock()
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].RequestedAt.Before(reqs[j].RequestedAt) })
	if !m.sight.clear(m.cfg.Now(), def.Membership.FailureThreshold.Std()) {
		// The view had a gap (a reconnect, a re-sync, a first read) less
		// than a failure threshold ago: a stale report may be one this
		// member could not see. Nobody loses its place for it yet.
		members = holdUnseen(prev, members)
	}

	// Every KV and event call is bounded well inside the lease: a stalled
	// one (JetStream waits 5 s by default) must not keep the leader from
	// its next round.
	limit := max(def.Election.LeaseDuration.Std()/2, 100*time.Millisecond)
	bounded := func(f func(context.Context) error) error {
		cctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		return f(cctx)
	}

	// Each request is claimed before it is acted on: a requester that gave
	// up waiting withdraws it by a compare-and-set too, so exactly one of
	// the two wins. One claimed meanwhile, withdrawn or seen at an old
	// revision is left for the watch to bring up to date.
	claimed := reqs[:0]
	for _, r := range reqs {
		if r.ClaimedBy == m.key {
			// Claimed in an earlier round that did not finish it (its
			// state write failed): ours already.
			claimed = append(claimed, r)
			continue
		}
		err := bounded(func(c context.Context) error {
			return m.store.claimRequest(c, def.Name, r.ClusterRequest, r.rev, m.key)
		})
		if err != nil {
			m.log.Debug().Err(err).Str("request", r.ID).Msg("request not claimed; not acted on this round")
			continue
		}
		claimed = append(claimed, r)
	}
	reqs = claimed

	in := Input{Def: def, Prev: prev, Members: members, Leader: m.key, LeaseEpoch: epoch, EpochFloor: m.epochSeen, Now: m.cfg.Now()}
	handoff := ""
	refused := map[string]string{} // request id -> why it was not carried out
	for _, r := range reqs {
		switch r.Op {
		case protocol.RequestRebalance:
			in.Rebalance = true
		case protocol.RequestFailover:
			if def.Mode == protocol.ModeActivePassive && (r.From == "" || r.From == m.key) {
				to := r.To
				if to == "" {
					to = m.bestStandby(prev, members)
					if to == "" {
						// Nobody could take over: the request was not
						// carried out, and says so (the CLI exits 2).
						refused[r.ID] = "no standby can take over (none alive, reporting and eligible)"
						m.log.Warn().Str("request", r.ID).Msg("failover request refused: no eligible standby; keeping leadership")
						continue
					}
				} else if why := handoffRefusal(prev, members, to); why != "" {
					// Handing off to a member that cannot take over
					// (a typo, gone, draining) would leave the cluster
					// leaderless while this leader sits out: keep leading.
					refused[r.ID] = to + ": " + why
					m.log.Warn().Str("request", r.ID).Str("to", to).Str("reason", why).Msg("failover request refused: keeping leadership")
					continue
				}
				handoff = to
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
	// Written by someone else after our last write: a deposed leader's late
	// put. Publish ours again, even if our content did not change.
	foreign := m.syncRev > pub.rev
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

	// A new epoch is published too: members ignore a sync older than the
	// state's epoch (see applySyncLocked).
	if sync.Digest != pub.digest || sync.Epoch != pub.epoch || foreign {
		sync.CapturedAt = m.cfg.Now().UTC()
		b, _ := json.Marshal(sync)
		if _, ok := m.lease.held(); ok {
			var rev uint64
			err := bounded(func(c context.Context) (err error) {
				rev, err = m.store.rt.Put(c, protocol.ClusterSyncKey(def.Name), b)
				return err
			})
			if err == nil {
				*pub = published{digest: sync.Digest, epoch: sync.Epoch, rev: rev}
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
		err = bounded(func(c context.Context) (err error) {
			rev, err = m.store.rt.Create(c, protocol.ClusterStateKey(def.Name), b)
			return err
		})
		if errors.Is(err, jetstream.ErrKeyExists) {
			// A state exists that we have not seen yet: read it first.
			m.rereadState(bounded, def.Name, prevRev)
			return false
		}
	} else {
		err = bounded(func(c context.Context) (err error) {
			rev, err = m.store.rt.Update(c, protocol.ClusterStateKey(def.Name), b, prevRev)
			return err
		})
		if streams.LostCAS(err) {
			// The stored state is not the one we hold: read it rather than
			// wait for the watch, which may never correct us (the state
			// deleted while our own earlier write was landing put that
			// write back as ours, and every Update after it failed).
			m.rereadState(bounded, def.Name, prevRev)
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn().Err(err).Msg("state not written (changed meanwhile?); retrying")
		}
		return false
	}
	m.mu.Lock()
	if rev > m.stateRev {
		m.setStateLocked(next, rev)
	}
	m.mu.Unlock()
	for _, e := range evs {
		if err := bounded(func(c context.Context) error { return m.store.events.Publish(c, e) }); err != nil {
			m.log.Warn().Err(err).Str("kind", string(e.Kind)).Msg("cluster event not published")
		}
		m.log.Info().Str("kind", string(e.Kind)).Str("agent", e.Agent).Str("reason", e.Reason).Interface("data", e.Data).Msg("cluster event")
	}
	for _, r := range reqs {
		data := map[string]string{"cluster": def.Name, "op": r.Op, "from": r.From, "to": r.To, "handled_by": m.key}
		if why, ok := refused[r.ID]; ok {
			data["refused"] = why
		}
		_ = bounded(func(c context.Context) error {
			return m.store.events.Publish(c, protocol.Event{Kind: protocol.EventClusterRequest, ID: r.ID, Reason: r.Reason, Data: data})
		})
		_ = bounded(func(c context.Context) error { return m.store.RemoveRequest(c, def.Name, r.ID) })
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

// rereadState replaces the state this member holds, of revision held, with
// the stored one: a newer one, or none (deleted) — then the next write
// creates it.
func (m *Member) rereadState(bounded func(func(context.Context) error) error, name string, held uint64) {
	var st protocol.ClusterState
	var r uint64
	err := bounded(func(c context.Context) (err error) {
		st, r, err = m.store.State(c, name)
		return err
	})
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case err == nil && r > m.stateRev:
		m.setStateLocked(st, r)
	case errors.Is(err, ErrNotFound) && m.stateRev == held:
		m.state, m.stateRev = protocol.ClusterState{}, 0
	}
}

// handoffRefusal says why a manual failover may not hand leadership to
// member to ("" if it may): it must be an alive member that could win the
// election (Candidates: not draining, not failed, not refused or excluded).
func handoffRefusal(prev protocol.ClusterState, members map[string]Observed, to string) string {
	o, ok := members[to]
	switch {
	case !ok:
		return "not a member of the cluster"
	case !o.Alive || o.Unseen:
		return "not reporting"
	case o.Report.Draining:
		return "draining"
	case o.Report.Health == "failed":
		return "health failed"
	}
	if len(Candidates(prev, []protocol.ClusterMemberReport{o.Report})) == 0 {
		if pm, known := prev.Member(to); known {
			return pm.Role
		}
		return "excluded"
	}
	return ""
}

// bestStandby is who a manual failover without --to hands off to.
func (m *Member) bestStandby(prev protocol.ClusterState, members map[string]Observed) string {
	var reps []protocol.ClusterMemberReport
	for k, o := range members {
		if o.Alive && !o.Unseen && k != m.key {
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

package supervisor

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/pkg/protocol"
)

// suspect is an agent whose presence vanished, waiting out the threshold.
type suspect struct {
	pool, agent string
	how         string // howStopped, howExpired, howOrphaned
	trigger     string // names this departure (failoverID)
	since       time.Time
}

// How a suspect left (the agent_failed event's reason).
const (
	// howStopped: it deleted its presence, at the end of a graceful stop.
	howStopped = "stopped"
	// howExpired: its presence expired (it crashed, hung or was cut off).
	howExpired = "presence expired"
	// howOrphaned: found absent with tasks in its queue; nobody saw it go.
	howOrphaned = "absent with tasks queued"
)

// suspects turns departures into failovers: an agent gone for longer than
// the failure threshold, and still absent when asked directly, is failed
// over; one that returns in time keeps its queue. Nothing is decided while
// sight is not clear (see sight).
type suspects struct {
	f         *failover
	view      *presence.View
	presence  jetstream.KeyValue
	sight     *sight
	threshold time.Duration
	retry     time.Duration
	log       zerolog.Logger
	pending   map[string]suspect
}

// run handles departures until ctx ends or the lease is lost.
func (s *suspects) run(ctx context.Context, departures <-chan presence.Change) error {
	s.pending = s.orphans(ctx)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next, err := s.decide(ctx, s.f.term.now())
		if err != nil {
			return nil // shutting down, or the term ended
		}
		if !next.IsZero() {
			timer.Reset(max(next.Sub(s.f.term.now()), time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case c := <-departures:
			s.depart(c)
		}
	}
}

func (s *suspects) depart(c presence.Change) {
	if c.Presence.ID == "" {
		return // never seen alive by this leader; the orphan scan covers it
	}
	how := howStopped
	if c.Expired {
		how = howExpired
	}
	s.log.Warn().Str("agent", c.Key).Str("how", how).Dur("threshold", s.threshold).Msg("agent gone; failing over after the threshold unless it returns")
	s.pending[c.Key] = suspect{pool: c.Presence.Pool, agent: c.Presence.ID, how: how, trigger: departureTrigger(c), since: s.f.term.now()}
}

// decide fails over every suspect whose time has come and returns when the
// next one is due (zero: none waits). An error means stop.
func (s *suspects) decide(ctx context.Context, now time.Time) (time.Time, error) {
	var next time.Time
	clear, clearAt := s.sight.clear(now)
	for key, sp := range s.pending {
		due := sp.since.Add(s.threshold)
		if !clear && clearAt.After(due) {
			due = clearAt
		}
		if now.Before(due) {
			if next.IsZero() || due.Before(next) {
				next = due
			}
			continue
		}
		err := s.judge(ctx, key, sp)
		if ctx.Err() != nil {
			return next, ctx.Err()
		}
		// errNotLeader too is retried: see recovery.due.
		if err != nil {
			s.log.Warn().Err(err).Str("agent", key).Msg("failover not done; retrying")
			sp.since = now.Add(s.retry - s.threshold)
			s.pending[key] = sp
			if r := now.Add(s.retry); next.IsZero() || r.Before(next) {
				next = r
			}
			continue
		}
		delete(s.pending, key)
	}
	return next, nil
}

// judge fails a suspect over unless it is present after all.
func (s *suspects) judge(ctx context.Context, key string, sp suspect) error {
	back, err := s.present(ctx, sp.pool, sp.agent)
	if err != nil {
		return err // cannot see: try again, never fail over blind
	}
	if back {
		s.log.Info().Str("agent", key).Msg("agent is present; it keeps its queue")
		return nil
	}
	if err := s.f.term.event(ctx, protocol.Event{Kind: protocol.EventAgentFailed, ID: sp.agent, Agent: sp.agent, Reason: sp.how,
		Data: map[string]string{"pool": sp.pool, "trigger": sp.trigger}}); err != nil {
		return err
	}
	move := s.f.transfer
	if sp.how == howStopped {
		// It lived to hand back what it ran: its tasks in hand are no
		// poison suspects (see agentStopped).
		move = s.f.transferStopped
	}
	_, err = move(ctx, sp.pool, sp.agent, sp.trigger)
	return err
}

// present reports whether the agent is present, from the view or, if the
// view lacks it, from a direct read of its presence key (a view that missed
// the agent's return must not fail it over).
func (s *suspects) present(ctx context.Context, pool, agent string) (bool, error) {
	key := protocol.PresenceKey(pool, agent)
	if _, ok := s.view.Get(key); ok {
		return true, nil
	}
	e, err := s.presence.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return false, nil
	case err != nil:
		return false, err
	}
	return e.Operation() == jetstream.KeyValuePut, nil
}

// orphans finds agents that left work in their queue while no leader
// watched: task subjects holding tasks whose agent is not present. Only
// subjects a pool and agent derive count. It reads the task streams'
// subjects, not the agents' consumers: a consumer is kept in memory, and
// a server restart forgets those of the agents that are gone, while
// their tasks stay in the stream. Found through the consumers only, an
// agent that crashed around a restart that also ended the leader's term
// (so no departure was seen) was not failed over: its steps waited for
// their leases.
func (s *suspects) orphans(ctx context.Context) map[string]suspect {
	out := map[string]suspect{}
	present := map[string]bool{}
	for _, p := range s.view.Agents() {
		present[protocol.PresenceKey(p.Pool, p.ID)] = true
	}
	for shard := 0; shard < s.f.shards; shard++ {
		stream, err := s.f.js.Stream(ctx, protocol.TaskStream(shard))
		if err != nil {
			s.log.Warn().Err(err).Int("shard", shard).Msg("orphan scan: task stream not readable; its agents' steps wait for their leases")
			continue
		}
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(protocol.TaskStreamSubjects(shard)))
		if err != nil {
			s.log.Warn().Err(err).Int("shard", shard).Msg("orphan scan: task subjects not readable; its agents' steps wait for their leases")
			continue
		}
		for subject, n := range info.State.Subjects {
			q, ok := taskOwner(subject, s.f.shards)
			if !ok || q.stream != protocol.TaskStream(shard) || n == 0 {
				continue
			}
			key := protocol.PresenceKey(q.pool, q.agent)
			if present[key] {
				continue
			}
			now := s.f.term.now()
			out[key] = suspect{pool: q.pool, agent: q.agent, how: howOrphaned, trigger: "orphaned:" + now.UTC().Format(time.RFC3339), since: now}
			s.log.Warn().Str("agent", key).Uint64("tasks", n).Msg("agent absent with tasks in its queue; failing over after the threshold")
		}
	}
	return out
}

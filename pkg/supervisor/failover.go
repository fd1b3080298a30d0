package supervisor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/wardenhq/warden/pkg/dispatch"
	"github.com/wardenhq/warden/pkg/jobstore"
	"github.com/wardenhq/warden/pkg/presence"
	"github.com/wardenhq/warden/pkg/protocol"
)

// suspect is an agent whose presence vanished, waiting out the threshold.
type suspect struct {
	presence protocol.Presence
	since    time.Time
}

// failoverLoop turns presence changes into failovers: an agent gone for
// longer than the failure threshold has its queued and unacked tasks moved
// to other agents of its pool. One that returns in time keeps its queue.
func (l *leader) failoverLoop(ctx context.Context, changes <-chan presence.Change) error {
	suspects := l.orphanedQueues(ctx)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	threshold := l.cfg.FailureThreshold.Std()
	for {
		now := l.now()
		next := time.Time{}
		for key, s := range suspects {
			due := s.since.Add(threshold)
			if now.Before(due) {
				if next.IsZero() || due.Before(next) {
					next = due
				}
				continue
			}
			if l.present(key) {
				l.log.Info().Str("agent", key).Msg("agent came back within the threshold; it keeps its queue")
				delete(suspects, key)
				continue
			}
			if err := l.failover(ctx, s); err != nil {
				if errors.Is(err, errNotLeader) || ctx.Err() != nil {
					return nil
				}
				l.log.Warn().Err(err).Str("agent", key).Msg("failover failed; retrying")
				s.since = now.Add(l.cfg.RecoveryRetry.Std() - threshold)
				suspects[key] = s
				continue
			}
			delete(suspects, key)
		}
		if !next.IsZero() {
			timer.Reset(max(next.Sub(now), time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case c := <-changes: // departures only (see leadTerm)
			if c.Presence.ID == "" {
				continue // never seen alive by this leader; orphan scan covers it
			}
			how := "stopped"
			if c.Expired {
				how = "presence expired"
			}
			l.log.Warn().Str("agent", c.Key).Str("how", how).Dur("threshold", threshold).Msg("agent gone; failing over after the threshold")
			_ = l.events.Publish(ctx, protocol.Event{Kind: "agent_failed", ID: c.Presence.ID, Agent: c.Presence.ID, Reason: how,
				Data: map[string]string{"pool": c.Presence.Pool}})
			suspects[c.Key] = suspect{presence: c.Presence, since: l.now()}
		}
	}
}

// orphanedQueues finds agents that left work in their queue while no leader
// watched: consumers with pending tasks whose agent is not present.
func (l *leader) orphanedQueues(ctx context.Context) map[string]suspect {
	out := map[string]suspect{}
	present := map[string]bool{}
	for _, p := range l.view.Agents() {
		present[protocol.PresenceKey(p.Pool, p.ID)] = true
	}
	for shard := 0; shard < l.cfg.TaskShards; shard++ {
		stream, err := l.js.Stream(ctx, protocol.TaskStream(shard))
		if err != nil {
			continue
		}
		lister := stream.ListConsumers(ctx)
		for info := range lister.Info() {
			parts := strings.Split(info.Config.FilterSubject, ".")
			if len(parts) != 5 || info.NumPending+uint64(info.NumAckPending) == 0 {
				continue
			}
			pool, agent := parts[3], parts[4]
			key := protocol.PresenceKey(pool, agent)
			if present[key] {
				continue
			}
			out[key] = suspect{
				presence: protocol.Presence{ID: agent, Pool: pool, TaskStream: protocol.TaskStream(shard), TaskSubject: info.Config.FilterSubject},
				since:    l.now(),
			}
			l.log.Warn().Str("agent", key).Uint64("queued", info.NumPending).Int("unacked", info.NumAckPending).
				Msg("agent absent with tasks in its queue; failing over after the threshold")
		}
	}
	return out
}

// FailoverRecord is published (event kind "failover") for every failover.
type FailoverRecord struct {
	ID         string        `json:"id"`
	Agent      string        `json:"agent"`
	Pool       string        `json:"pool"`
	Targets    []string      `json:"targets,omitempty"`
	TasksMoved int           `json:"tasks_moved"`
	Waiting    int           `json:"waiting"`
	StartedAt  time.Time     `json:"started_at"`
	Duration   time.Duration `json:"duration"`
	Outcome    string        `json:"outcome"`
}

// Failover outcomes.
const (
	OutcomeTransferred = "transferred"
	OutcomeNoTarget    = "no_target"
	OutcomeNothing     = "nothing_to_move"
)

// failover moves every task in a failed agent's queue, unacked or not:
// each step still held by the agent at the task's epoch is released and
// re-dispatched with a new epoch to the best other agent; then the original
// message is deleted. Stale tasks (their step moved on) are just deleted.
func (l *leader) failover(ctx context.Context, s suspect) error {
	_, err := l.failoverRecord(ctx, s)
	return err
}

func (l *leader) failoverRecord(ctx context.Context, s suspect) (FailoverRecord, error) {
	p := s.presence
	rec := FailoverRecord{ID: nuid.Next(), Agent: p.ID, Pool: p.Pool, StartedAt: l.now().UTC()}
	streamName, subject := p.TaskStream, p.TaskSubject
	if subject == "" {
		shard := protocol.Shard(p.Pool, p.ID, l.cfg.TaskShards)
		streamName, subject = protocol.TaskStream(shard), protocol.TaskSubject(shard, p.Pool, p.ID)
	}
	stream, err := l.js.Stream(ctx, streamName)
	if err != nil {
		return rec, fmt.Errorf("task stream %s: %w", streamName, err)
	}
	// Tasks past the consumer's delivered sequence never reached the agent.
	delivered := uint64(0)
	if cons, err := stream.Consumer(ctx, p.ID); err == nil {
		if info, err := cons.Info(ctx); err == nil {
			delivered = info.Delivered.Stream
		}
	}
	moved := map[string][]string{} // job -> steps
	for seq := uint64(1); ; {
		raw, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return rec, fmt.Errorf("read queue of %s: %w", p.ID, err)
		}
		seq = raw.Sequence + 1
		if err := l.fence(); err != nil {
			return rec, err
		}
		job, step := raw.Header.Get(protocol.HeaderJob), raw.Header.Get(protocol.HeaderStep)
		epoch, _ := strconv.ParseUint(raw.Header.Get(protocol.HeaderEpoch), 10, 64)
		released, err := l.releaseForTransfer(ctx, job, step, epoch, p.ID, raw, raw.Sequence <= delivered)
		if err != nil {
			return rec, err
		}
		if released {
			moved[job] = append(moved[job], step)
			rec.TasksMoved++
		} else if _, ok := moved[job]; !ok && protocol.ValidToken(job) {
			// Parked as poison (or stale): the job still has to move on.
			moved[job] = nil
		}
		if err := stream.DeleteMsg(ctx, raw.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return rec, fmt.Errorf("delete transferred task %d: %w", raw.Sequence, err)
		}
	}
	targets := map[string]bool{}
	for job, steps := range moved {
		if err := l.dispatch.Advance(ctx, job); err != nil && !errors.Is(err, dispatch.ErrWaiting) {
			l.log.Warn().Err(err).Str("job_id", job).Msg("advance after failover failed; recovery will retry")
		}
		for _, id := range steps {
			st, _, err := l.store.Step(ctx, job, id)
			switch {
			case err != nil:
			case st.State == jobstore.StepDispatched:
				targets[st.Actor] = true
			case st.State == jobstore.StepPending:
				rec.Waiting++
			}
		}
	}
	for t := range targets {
		rec.Targets = append(rec.Targets, t)
	}
	rec.Duration = l.now().Sub(rec.StartedAt)
	switch {
	case rec.TasksMoved == 0:
		rec.Outcome = OutcomeNothing
	case rec.Waiting > 0:
		rec.Outcome = OutcomeNoTarget
	default:
		rec.Outcome = OutcomeTransferred
	}
	l.metrics.failovers.WithLabelValues(rec.Outcome).Inc()
	l.metrics.transferred.Add(float64(rec.TasksMoved))
	l.publishFailover(ctx, rec)
	return rec, nil
}

// releaseForTransfer releases the step a queued task stands for, if the
// failed agent still holds it at the task's epoch; a step taken back too
// often is parked as poison instead.
//
// inFlight says the agent had been given the task (it may have been running
// it when the agent died); only then does the transfer count towards the
// poison threshold.
func (l *leader) releaseForTransfer(ctx context.Context, job, step string, epoch uint64, agent string, raw *jetstream.RawStreamMsg, inFlight bool) (bool, error) {
	if !protocol.ValidToken(job) || !protocol.ValidToken(step) {
		return false, nil
	}
	for range 8 {
		st, rev, err := l.store.Step(ctx, job, step)
		if errors.Is(err, jobstore.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if st.Epoch != epoch || st.State != jobstore.StepDispatched || st.Actor != agent {
			return false, nil
		}
		if inFlight && st.Recoveries+1 >= l.cfg.PoisonThreshold {
			why := fmt.Sprintf("poison: its agents failed %d times while running it (last: %s)", st.Recoveries+1, agent)
			err := l.deadLetterStep(ctx, st, rev, "poison", why, raw, 0)
			if errors.Is(err, jobstore.ErrConflict) {
				continue
			}
			return false, err
		}
		_ = st.Release("transferred", "agent "+agent+" failed", inFlight, l.now().UTC())
		if err := l.fence(); err != nil {
			return false, err
		}
		_, err = l.store.UpdateStep(ctx, st, rev)
		if errors.Is(err, jobstore.ErrConflict) {
			continue
		}
		if err != nil {
			return false, err
		}
		l.metrics.recovered.WithLabelValues("transferred").Inc()
		return true, nil
	}
	return false, jobstore.ErrConflict
}

func (l *leader) publishFailover(ctx context.Context, r FailoverRecord) {
	log := l.log.With().Str("failover_id", r.ID).Str("agent", r.Agent).Logger()
	e := log.Info()
	if r.Outcome == OutcomeNoTarget {
		e = log.Warn()
	}
	e.Strs("targets", r.Targets).Int("tasks_moved", r.TasksMoved).Int("waiting", r.Waiting).
		Dur("duration", r.Duration).Str("outcome", r.Outcome).Msg("failover")
	data := map[string]string{
		"failover_id": r.ID, "pool": r.Pool, "targets": strings.Join(r.Targets, ","),
		"tasks_moved": strconv.Itoa(r.TasksMoved), "waiting": strconv.Itoa(r.Waiting),
		"started_at": r.StartedAt.Format(time.RFC3339Nano), "duration": r.Duration.String(), "outcome": r.Outcome,
	}
	reason := ""
	if r.Outcome == OutcomeNoTarget {
		reason = fmt.Sprintf("%d tasks wait: no other agent of pool %s can take them", r.Waiting, r.Pool)
	}
	if err := l.events.Publish(ctx, protocol.Event{Kind: "failover", ID: r.ID, Agent: r.Agent, Reason: reason, Data: data}); err != nil {
		log.Warn().Err(err).Msg("failover event not published")
	}
}

// present reports whether the agent with presence key is in the view now.
func (l *leader) present(key string) bool {
	pool, id, _ := strings.Cut(key, ".")
	for _, p := range l.view.Pool(pool) {
		if p.ID == id {
			return true
		}
	}
	return false
}

package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/dispatch"
	"github.com/wardenhq/warden/pkg/jobstore"
	"github.com/wardenhq/warden/pkg/logging"
	"github.com/wardenhq/warden/pkg/protocol"
)

// errNotLeader stops a write the leader may no longer make.
var errNotLeader = errors.New("not the supervisor leader any more")

// recoverLoop keeps the index of inconsistent steps and jobs from a watch
// of the job store and acts on each when it falls due. It returns when ctx
// ends (leadership lost or shutdown); a new leader rebuilds the index.
func (l *leader) recoverLoop(ctx context.Context) error {
	idx := NewIndex(l.cfg.RecoveryGrace.Std())
	w, err := l.store.KV().WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch job store: %w", err)
	}
	defer func() { _ = w.Stop() }()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	loaded := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("job store watch closed")
			}
			if e == nil {
				loaded = true
				l.log.Info().Int("due_items", idx.Len()).Msg("recovery index built")
			} else {
				l.observe(idx, e)
			}
		case <-timer.C:
		}
		if !loaded {
			continue
		}
		now := l.now()
		for _, it := range idx.PopDue(now) {
			if err := l.handleDue(ctx, it, now); err != nil {
				if errors.Is(err, errNotLeader) || ctx.Err() != nil {
					return nil
				}
				retry := l.cfg.RecoveryRetry.Std()
				if errors.Is(err, dispatch.ErrWaiting) {
					retry = l.cfg.RecoveryGrace.Std()
				}
				l.log.Debug().Err(err).Str(logging.FieldJob, it.job).Str(logging.FieldStep, it.step).Msg("recovery deferred")
				idx.Defer(it, now.Add(retry))
			}
		}
		if next, ok := idx.Next(); ok {
			timer.Reset(max(time.Until(next), time.Millisecond))
		}
	}
}

func (l *leader) observe(idx *Index, e jetstream.KeyValueEntry) {
	key := e.Key()
	deleted := e.Operation() != jetstream.KeyValuePut
	switch {
	case strings.HasPrefix(key, "step."):
		parts := strings.SplitN(strings.TrimPrefix(key, "step."), ".", 2)
		if len(parts) != 2 {
			return
		}
		if deleted {
			idx.ForgetStep(parts[0], parts[1])
			return
		}
		var st jobstore.Step
		if err := json.Unmarshal(e.Value(), &st); err != nil {
			l.log.Warn().Err(err).Str("key", key).Msg("undecodable step record")
			return
		}
		idx.ObserveStep(&st)
	case strings.HasPrefix(key, "job."):
		id := strings.TrimPrefix(key, "job.")
		if deleted {
			idx.ForgetJob(id)
			return
		}
		var jb jobstore.Job
		if err := json.Unmarshal(e.Value(), &jb); err != nil {
			l.log.Warn().Err(err).Str("key", key).Msg("undecodable job record")
			return
		}
		idx.ObserveJob(&jb)
	}
}

// handleDue acts on one due item, reading only its own records.
func (l *leader) handleDue(ctx context.Context, it *item, now time.Time) error {
	if err := l.fence(); err != nil {
		return err
	}
	if it.kind == itemJob {
		return l.dispatch.Advance(ctx, it.job)
	}
	st, rev, err := l.store.Step(ctx, it.job, it.step)
	if errors.Is(err, jobstore.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	log := l.log.With().Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Logger()
	switch st.State {
	case jobstore.StepPending:
		// No scheduler moved it within the grace period.
		log.Info().Msg("advancing a stalled pending step")
		return l.dispatch.Advance(ctx, st.JobID)
	case jobstore.StepDispatched:
		if now.Before(st.LockedUntil) {
			return nil // renewed since; the watch has re-queued it
		}
		reason := fmt.Sprintf("lease expired at %s on agent %s", st.LockedUntil.Format(time.RFC3339), st.Actor)
		return l.takeBack(ctx, st, rev, "lease_expired", reason)
	}
	return nil
}

// takeBack releases a dispatched step and advances its job, or parks it as
// poison once it has been taken back too often.
func (l *leader) takeBack(ctx context.Context, st *jobstore.Step, rev uint64, status, reason string) error {
	log := l.log.With().Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Str(logging.FieldAgent, st.Actor).Logger()
	now := l.now().UTC()
	if st.Recoveries+1 >= l.cfg.PoisonThreshold {
		why := fmt.Sprintf("poison: taken back from its agent %d times (last: %s)", st.Recoveries+1, reason)
		if err := l.deadLetterStep(ctx, st, rev, "poison", why, nil, 0); err != nil {
			return err
		}
		log.Warn().Str("reason", why).Msg("step parked in the dead-letter stream")
		return l.dispatch.Advance(ctx, st.JobID)
	}
	if err := st.Release(status, reason, true, now); err != nil {
		return nil
	}
	if err := l.fence(); err != nil {
		return err
	}
	if _, err := l.store.UpdateStep(ctx, st, rev); err != nil {
		return err
	}
	l.metrics.recovered.WithLabelValues(status).Inc()
	log.Warn().Str("reason", reason).Int("recoveries", st.Recoveries).Msg("step taken back for re-dispatch")
	_ = l.events.Publish(ctx, protocol.Event{Kind: "step_recovered", ID: st.JobID, JobID: st.JobID, StepID: st.ID,
		Agent: st.TransferredFrom, Reason: reason})
	return l.dispatch.Advance(ctx, st.JobID)
}

package supervisor

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/logging"
)

// recovery keeps the index of inconsistent steps and jobs from a watch of
// the job store and acts on each when it falls due: a step whose lease
// expired is released (a scheduler re-dispatches it), a pending step or a
// stalled job that no scheduler moved within the grace is the subject of
// an advance request, and a job whose advance request failed is asked
// about again. A new leader rebuilds the index.
type recovery struct {
	term    *term
	store   *jobstore.Store
	release *releaser
	adv     *advancer
	grace   time.Duration
	retry   time.Duration
	log     zerolog.Logger
	// built is closed once the index holds the whole store.
	built chan struct{}
}

// run follows the job store and acts until ctx ends or the lease is lost.
func (r *recovery) run(ctx context.Context) error {
	idx := NewIndex(r.grace)
	records := make(chan Record, 4096)
	errc := make(chan error, 1)
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f := &follower{js: r.term.js, kv: r.store.KV(), log: r.log}
	// The follower says it has sent every stored write with a record
	// without a key, behind those writes on the same channel: a separate
	// signal could be taken while writes still wait in the buffer, and
	// the index be called built before it holds them.
	loaded := func() {
		select {
		case records <- Record{}:
		case <-fctx.Done():
		}
	}
	go func() { errc <- f.run(fctx, records, loaded) }()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	built := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if err == nil {
				err = errors.New("job store follower stopped")
			}
			return err
		case job := <-r.adv.retries:
			idx.RetryAdvance(job, r.term.now().Add(r.retry))
		case rec := <-records:
			if rec.Key != "" {
				idx.Observe(rec)
				break
			}
			built = true
			r.log.Info().Int("unfinished_records", idx.Size()).Int("scheduled", idx.Len()).Msg("recovery index built")
			close(r.built)
		case <-timer.C:
		}
		if !built {
			continue
		}
		if err := r.due(ctx, idx); err != nil {
			return nil // shutting down, or the term ended
		}
		if next, ok := idx.Next(); ok {
			timer.Reset(max(next.Sub(r.term.now()), time.Millisecond))
		}
	}
}

// due handles every entry due now; an error means stop. A fence that
// fails (errNotLeader) is not a stop: Leader() also says no for the moment
// a renewal takes past the lease's last sure instant, and the term's
// context, not the fence, ends the term when the lease is really lost. The
// entry is tried again after recovery_retry, as after any other failure;
// returning instead left the term running with its recovery gone.
func (r *recovery) due(ctx context.Context, idx *Index) error {
	now := r.term.now()
	asked := map[string]bool{} // one advance request per job per round
	for _, d := range idx.PopDue(now) {
		recheck, err := r.handle(ctx, d, now, asked)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			r.log.Debug().Err(err).Str("key", d.Key).Msg("recovery deferred")
			idx.Retry(d, now.Add(r.retry))
		case recheck:
			// Asked and answered; if the record does not move (no agent
			// yet, say), ask again: soon after the first answer (the
			// scheduler that gave it may have parked the job in its memory
			// and died), then less and less often. A move of the record
			// (a dispatch, an end) reschedules or drops the entry first.
			idx.Recheck(d.Key, now)
		}
	}
	return nil
}

// handle acts on one due entry. recheck says it should come due again
// unless its record changes first.
func (r *recovery) handle(ctx context.Context, d Due, now time.Time, asked map[string]bool) (recheck bool, err error) {
	if err := r.term.fence(); err != nil {
		return false, err
	}
	if d.Locked {
		released, err := r.expire(ctx, d)
		if err != nil || released {
			return false, err
		}
		// Nothing to release: the index's lease is not the record's (a
		// renewal not read yet, an unreadable record or header). The write
		// that changed it reschedules the entry; if none comes, it is looked
		// at again after the backoff, and the job is asked about meanwhile,
		// in case what the index could not read is a step waiting for a
		// dispatch. Dropping it, as before, left such a record unwatched.
		if asked[d.Job] {
			return true, nil
		}
		asked[d.Job] = true
		return true, r.adv.Advance(ctx, d.Job)
	}
	if d.Kind != kindAdvance {
		r.log.Info().Str(logging.FieldJob, d.Job).Str("record", d.Key).Msg("asking a scheduler to advance a stalled job")
	}
	if asked[d.Job] {
		return d.Kind != kindAdvance, nil
	}
	asked[d.Job] = true
	return d.Kind != kindAdvance, r.adv.Advance(ctx, d.Job)
}

// expire releases the steps of a record whose lease has passed (a step
// record, or a job record holding its steps inline) and asks for the job
// to be advanced. The records are read through the job store. released
// says whether any step was taken back; a record that is gone counts as
// settled.
func (r *recovery) expire(ctx context.Context, d Due) (released bool, err error) {
	steps := []string{d.Step}
	if d.Kind == kindJob {
		job, _, err := r.store.Job(ctx, d.Job)
		if errors.Is(err, jobstore.ErrNotFound) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		steps = steps[:0]
		for _, sp := range job.Spec.Steps {
			steps = append(steps, sp.ID)
		}
	}
	any := false
	for _, id := range steps {
		out, err := r.release.release(ctx, d.Job, id, cause{status: statusLeaseExpired,
			expired: true, suspect: true})
		if err != nil {
			return false, err
		}
		any = any || out != untouched
	}
	if any {
		r.adv.AdvanceOrRetry(ctx, d.Job)
	}
	return any, nil
}

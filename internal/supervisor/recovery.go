package supervisor

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/pkg/protocol"
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
// Due entries are handled by recoveryAsks workers (recovery_asks.go), so
// that the loop goes on following the store, and other jobs come due,
// while a scheduler takes its time to answer.
func (r *recovery) run(ctx context.Context) error {
	idx := NewIndex(r.grace)
	records := make(chan Record, 4096)
	errc := make(chan error, 1)
	a := newAsks()
	var workers sync.WaitGroup
	defer workers.Wait()
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
	for range recoveryAsks {
		workers.Add(1)
		go func() {
			defer workers.Done()
			r.asker(fctx, a.work, a.done)
		}()
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	built := false
	for {
		work, head := a.head()
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
		case work <- head:
			a.handedOut()
		case jr := <-a.done:
			handled, retry := a.finished(jr)
			r.settle(idx, handled)
			for _, d := range retry {
				idx.Retry(d, r.term.now().Add(r.retry))
			}
		case <-timer.C:
		}
		if !built {
			continue
		}
		now := r.term.now()
		a.add(idx.PopDueAtMost(now, a.room()))
		// With the queue full, what is due waits for a round to come back
		// (the done case), not for the timer.
		if next, ok := idx.Next(); ok && (a.room() > 0 || next.After(now)) {
			timer.Reset(max(next.Sub(now), time.Millisecond))
		}
	}
}

// settle schedules each handled entry again as its outcome says. A fence
// that failed (errNotLeader) is not a stop: Leader() also says no for the
// moment a renewal takes past the lease's last sure instant, and the
// term's context, not the fence, ends the term when the lease is really
// lost. The entry is tried again after recovery_retry, as after any other
// failure; returning instead left the term running with its recovery gone.
func (r *recovery) settle(idx *Index, handled []outcome) {
	now := r.term.now()
	for _, o := range handled {
		switch {
		case errors.Is(o.err, protocol.ErrNotFound):
			// Answered: no scheduler has the job's record. A step record
			// outlived it (a compensation's stray of an older version, a
			// job record purged by hand); asked about again on the backoff
			// of any answered ask, not every recovery_retry for ever.
			r.log.Debug().Err(o.err).Str("key", o.d.Key).Msg("recovery: the job has no record")
			idx.Recheck(o.d, now)
		case o.err != nil:
			r.log.Debug().Err(o.err).Str("key", o.d.Key).Msg("recovery deferred")
			idx.Retry(o.d, now.Add(r.retry))
		case o.recheck:
			// Asked and answered; if the record does not move (no agent
			// yet, say), ask again: soon after the first answer (the
			// scheduler that gave it may have parked the job in its memory
			// and died), then less and less often. A move of the record (a
			// dispatch, an end) reschedules or drops the entry first.
			idx.Recheck(o.d, now)
		}
	}
}

// asker handles the due entries of one job at a time, in order, with at
// most one advance request per job, until ctx ends.
func (r *recovery) asker(ctx context.Context, work <-chan *jobRound, done chan<- *jobRound) {
	for {
		select {
		case <-ctx.Done():
			return
		case jr := <-work:
			asked := false
			for i := range jr.entries {
				if ctx.Err() != nil {
					return
				}
				o := &jr.entries[i]
				o.recheck, o.err = r.handle(ctx, o.d, &asked)
			}
			select {
			case done <- jr:
			case <-ctx.Done():
				return
			}
		}
	}
}

// handle acts on one due entry; asked says whether its job has been asked
// about in this round already. recheck says it should come due again
// unless its record changes first.
func (r *recovery) handle(ctx context.Context, d Due, asked *bool) (recheck bool, err error) {
	if err := r.term.fence(); err != nil {
		return false, err
	}
	if d.Locked {
		released, err := r.expire(ctx, d)
		if released {
			*asked = true // expire asked about the job
		}
		if err != nil || released {
			return false, err
		}
		// Nothing to release: the index's lease is not the record's (a
		// renewal not read yet, an unreadable record or header). The write
		// that changed it reschedules the entry; if none comes, it is looked
		// at again after the backoff, and the job is asked about meanwhile,
		// in case what the index could not read is a step waiting for a
		// dispatch. Dropping it, as before, left such a record unwatched.
		if *asked {
			return true, nil
		}
		*asked = true
		return true, r.adv.Advance(ctx, d.Job)
	}
	if d.Kind != kindAdvance {
		r.log.Info().Str(logging.FieldJob, d.Job).Str("record", d.Key).Msg("asking a scheduler to advance a stalled job")
	}
	if *asked {
		return d.Kind != kindAdvance, nil
	}
	*asked = true
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

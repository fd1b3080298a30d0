package jobstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Answering a listing from an Index.
//
// A listing must see every job write stored before it began, as a scan
// started then would (a job submitted, then listed at once, is there). So
// it first asks the stream for its last sequence (one stream info) and,
// when the index has not applied every job write up to it, asks the
// stream leader for the first job write past what the index covers (one
// message get, next_by_subj): none up to that sequence, and the index is
// current; one, and the listing waits for the follower to apply it, then
// looks again. All of it within IndexConfig.CatchUp, else the listing
// scans. (A stream info per listing is O(1) on the server; the last
// message of "job.*" would be one request too, but the server finds it by
// matching every job subject.)

// Why a listing was not answered from the index.
var (
	errIndexNotReady    = errors.New("job index not built")
	errIndexBehind      = errors.New("job index behind the stream")
	errIndexRebuilt     = errors.New("job index dropped or rebuilt during the listing")
	errIndexStreamReset = errors.New("job index: the jobs stream was purged or made again")
)

// page fills out and sel from the index when it is current (see above);
// false: the caller scans.
func (ix *Index) page(ctx context.Context, f ListFilter, limit int, after *JobEntry, out *ListPage, sel *[]JobEntry) bool {
	gen, err := ix.await(ctx)
	if err == nil {
		ix.mu.RLock()
		if ix.ready && ix.gen == gen {
			*out, *sel = ix.pageLocked(f, limit, after)
		} else {
			err = errIndexRebuilt
		}
		ix.mu.RUnlock()
	}
	if err != nil {
		ix.fallbacks.Add(1)
		ix.cfg.Logger.Debug().Err(err).Str("component", "job_index").Msg("listing by a scan")
		return false
	}
	ix.indexed.Add(1)
	return true
}

// await returns once the index has applied every job write stored before
// the call, with the generation it checked.
func (ix *Index) await(ctx context.Context) (uint64, error) {
	ix.mu.RLock()
	ready, gen := ix.ready, ix.gen
	ix.mu.RUnlock()
	if !ready {
		return 0, errIndexNotReady
	}
	cctx, cancel := context.WithTimeout(ctx, ix.cfg.CatchUp)
	defer cancel()
	st, err := ix.js.Stream(cctx, ix.store.stream)
	if err != nil {
		return 0, fmt.Errorf("job index: last sequence: %w", err)
	}
	if err := ix.checkStream(gen, st.CachedInfo().State); err != nil {
		return 0, err
	}
	last := st.CachedInfo().State.LastSeq
	for {
		covered, err := ix.covers(gen)
		if err != nil {
			return 0, err
		}
		if covered >= last {
			return gen, ix.checkHead(gen, st.CachedInfo().State)
		}
		next, found, err := ix.nextJobWrite(cctx, covered+1)
		if err != nil {
			return 0, fmt.Errorf("job index: next job write: %w", err)
		}
		if !found {
			// No job write after covered: the index is current up to last.
			// (One found past last is waited for all the same: a job
			// written at or before last may have been rewritten since,
			// its first write gone, and only the follower applying the
			// rewrite brings it in.)
			ix.mu.Lock()
			if ix.gen == gen {
				ix.covered = max(ix.covered, last)
			}
			ix.mu.Unlock()
			return gen, ix.checkHead(gen, st.CachedInfo().State)
		}
		if err := ix.waitFor(cctx, ctx, gen, next); err != nil {
			return 0, err
		}
	}
}

// checkStream ends the follower of an index the stream no longer
// matches: its last sequence below what the index covers (the stream was
// deleted and made again), or no message left while the index holds jobs
// (purged whole). Run rebuilds it.
func (ix *Index) checkStream(gen uint64, st jetstream.StreamState) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if !ix.ready || ix.gen != gen {
		return errIndexRebuilt
	}
	if st.LastSeq >= ix.covered && (st.Msgs > 0 || len(ix.byID) == 0) {
		return nil
	}
	return ix.reset(fmt.Errorf("%w: stream at sequence %d with %d messages, index at %d with %d jobs",
		errIndexStreamReset, st.LastSeq, st.Msgs, ix.covered, len(ix.byID)))
}

// checkHead ends the follower of an index that holds jobs whose records
// are gone without a marker (st, read before the index caught up with the
// stream's last message): a purge writes no markers, and purged, then
// written again, the stream passed checkStream. Every live entry's
// revision is a message still stored, so no job's revision is below the
// stream's first message. (Counting messages would not do: jobs made
// after st was read are indexed by now.) The index is walked when the
// stream's head passes the least revision it knows, at most every
// walkEvery after the first time since the build (under the index's lock:
// with retention removing jobs in the order they were made, the head
// passes it all the time).
// Judged only once the index has applied every write up to that read: a
// record its retention removed leaves a marker by then.
func (ix *Index) checkHead(gen uint64, st jetstream.StreamState) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if !ix.ready || ix.gen != gen {
		return errIndexRebuilt
	}
	if (ix.oldest != 0 && st.FirstSeq <= ix.oldest) || (!ix.walked.IsZero() && ix.cfg.Now().Sub(ix.walked) < walkEvery) {
		return nil
	}
	// Entries rewritten since oldest was taken raised theirs (and an
	// index built empty knows none): look again.
	ix.oldest, ix.walked = ix.leastRevision(), ix.cfg.Now()
	if ix.oldest == 0 || st.FirstSeq <= ix.oldest {
		return nil
	}
	return ix.reset(fmt.Errorf("%w: stream's first message %d past job revision %d", errIndexStreamReset, st.FirstSeq, ix.oldest))
}

// walkEvery bounds how often checkHead walks the index.
const walkEvery = 10 * time.Second

// reset ends the follower (Run rebuilds the index) and returns err. Lock
// held.
func (ix *Index) reset(err error) error {
	if ix.abort != nil {
		ix.abort(err)
	}
	return err
}

// covers is the sequence the index covers, if it is still generation gen.
func (ix *Index) covers(gen uint64) (uint64, error) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if !ix.ready || ix.gen != gen {
		return 0, errIndexRebuilt
	}
	return ix.covered, nil
}

// waitFor waits until the follower has applied the write at seq. cctx
// bounds the wait; when it ends first (ctx, the caller's, still going) and
// the follower has applied nothing for IndexConfig.Stall, the follower is
// taken for stalled and ended: Run rebuilds the index.
func (ix *Index) waitFor(cctx, ctx context.Context, gen, seq uint64) error {
	for {
		ix.mu.Lock()
		if !ix.ready || ix.gen != gen {
			ix.mu.Unlock()
			return errIndexRebuilt
		}
		if ix.covered >= seq {
			ix.mu.Unlock()
			return nil
		}
		if ix.changed == nil {
			ix.changed = make(chan struct{})
		}
		ch := ix.changed
		ix.mu.Unlock()
		select {
		case <-ch:
		case <-cctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			ix.mu.Lock()
			if ix.ready && ix.gen == gen && ix.covered < seq {
				now := ix.cfg.Now()
				if ix.behind.IsZero() {
					ix.behind = now.Add(-ix.cfg.CatchUp) // this listing's wait
				}
				if since := later(ix.progress, ix.behind); now.Sub(since) >= ix.cfg.Stall && ix.abort != nil {
					ix.abort(fmt.Errorf("%w: job write %d not applied, behind since %s", errIndexStalled, seq, since.Format("15:04:05.000")))
				}
			}
			ix.mu.Unlock()
			return fmt.Errorf("%w: job write %d not applied in %s", errIndexBehind, seq, ix.cfg.CatchUp)
		}
	}
}

// nextJobWrite asks the stream's leader (not a replica that may lag, as a
// direct get would) for the sequence of the first job write at or after
// from.
func (ix *Index) nextJobWrite(ctx context.Context, from uint64) (uint64, bool, error) {
	msg, err := leaderGet(ctx, ix.js.Conn(), ix.store.stream, struct {
		Seq      uint64 `json:"seq"`
		NextFor  string `json:"next_by_subj"`
		NoHeader bool   `json:"no_hdr"`
	}{from, jobKeysFilter, true})
	if errors.Is(err, ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return msg.Seq, true, nil
}

// pageLocked is pageOf over the index: counts kept up to date, the
// created bounds found by binary search in order, and only the page's
// entries (and, with a state or time filter, the matches) visited. Read
// lock held.
func (ix *Index) pageLocked(f ListFilter, limit int, after *JobEntry) (ListPage, []JobEntry) {
	page := ListPage{Counts: make(map[JobState]int, len(ix.counts)), Scanned: len(ix.byID)}
	for s, n := range ix.counts {
		page.Counts[s] = n
	}
	order := ix.order
	lo, hi := 0, len(order)
	if !f.CreatedAfter.IsZero() {
		lo = sort.Search(len(order), func(i int) bool { return !order[i].Created.Before(f.CreatedAfter) })
	}
	if !f.CreatedBefore.IsZero() {
		hi = max(lo, sort.Search(len(order), func(i int) bool { return !order[i].Created.Before(f.CreatedBefore) }))
	}
	keep := func(sl *slot) bool {
		return !sl.removed && f.wantsState(sl.State)
	}
	switch {
	case lo == 0 && hi == len(order) && len(f.States) == 0:
		page.Matched = len(ix.byID)
	case lo == 0 && hi == len(order):
		var seen []JobState
		for _, s := range f.States {
			if !slices.Contains(seen, s) {
				seen = append(seen, s)
				page.Matched += ix.counts[s]
			}
		}
	default:
		for _, sl := range order[lo:hi] {
			if keep(sl) {
				page.Matched++
			}
		}
	}
	start := hi
	if after != nil {
		// The jobs listed after the cursor's are order's prefix.
		start = min(start, sort.Search(len(order), func(i int) bool { return compareEntries(order[i].JobEntry, *after) <= 0 }))
	}
	sel := make([]JobEntry, 0, min(limit+1, max(start-lo, 0)))
	for i := start - 1; i >= lo && len(sel) <= limit; i-- {
		if keep(order[i]) {
			sel = append(sel, order[i].JobEntry)
		}
	}
	if len(sel) > limit {
		sel = sel[:limit]
		page.Next = encodeCursor(sel[limit-1])
	}
	return page, sel
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

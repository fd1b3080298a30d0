package jobstore

import (
	"slices"
	"strings"
	"time"
)

// The index's entries: a slot per job, found by id (byID) and kept in
// listing order (order), so that a page is read off the end of order
// rather than sorted out of every entry.

// install replaces the index with a scan's entries, complete up to the
// stream sequence last, and marks it ready.
func (ix *Index) install(entries []JobEntry, last uint64) {
	byID := make(map[string]*slot, len(entries))
	order := make([]*slot, 0, len(entries))
	counts := map[JobState]int{}
	for _, e := range entries {
		sl := newSlot(e)
		byID[sl.ID] = sl
		order = append(order, sl)
		counts[sl.State]++
	}
	slices.SortFunc(order, func(a, b *slot) int { return compareEntries(b.JobEntry, a.JobEntry) }) // oldest first
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.byID, ix.order, ix.removed, ix.counts = byID, order, 0, counts
	ix.covered, ix.progress, ix.behind, ix.oldest, ix.walked = last, ix.cfg.Now(), time.Time{}, ix.leastRevision(), time.Time{}
	ix.gen++
	ix.ready = true
	ix.builds.Add(1)
	ix.wake()
}

// drop marks the index unusable and frees its entries.
func (ix *Index) drop() {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.ready = false
	ix.byID, ix.order, ix.removed, ix.counts, ix.covered = nil, nil, 0, nil, 0
	ix.abort = nil
	ix.wake()
}

// put stores e unless the index holds a newer write of its job. Lock held.
func (ix *Index) put(e JobEntry) {
	if sl, ok := ix.byID[e.ID]; ok {
		if e.Revision <= sl.Revision {
			return
		}
		ix.count(sl.State, -1)
		if sl.Created.Equal(e.Created) { // its place in order holds
			sl.fill(e)
			ix.count(sl.State, 1)
			return
		}
		ix.unlink(sl)
	}
	sl := newSlot(e)
	ix.byID[sl.ID] = sl
	ix.count(sl.State, 1)
	i, _ := slices.BinarySearchFunc(ix.order, sl, func(x, k *slot) int { return compareEntries(k.JobEntry, x.JobEntry) })
	ix.order = slices.Insert(ix.order, i, sl)
}

// remove forgets a job, removed by the write at seq. Lock held.
func (ix *Index) remove(id string, seq uint64) {
	sl, ok := ix.byID[id]
	if !ok || seq <= sl.Revision {
		return
	}
	ix.count(sl.State, -1)
	ix.unlink(sl)
}

// unlink takes sl out of byID and marks it removed in order, which is
// compacted once removed slots are a quarter of it. Lock held.
func (ix *Index) unlink(sl *slot) {
	delete(ix.byID, sl.ID)
	sl.removed = true
	ix.removed++
	if ix.removed > 1024 && ix.removed*4 > len(ix.order) {
		ix.order = slices.DeleteFunc(ix.order, func(s *slot) bool { return s.removed })
		if cap(ix.order) > 2*len(ix.order)+1024 {
			ix.order = slices.Clone(ix.order)
		}
		ix.removed = 0
	}
}

func (ix *Index) count(s JobState, d int) {
	if ix.counts[s] += d; ix.counts[s] == 0 {
		delete(ix.counts, s)
	}
}

// advance records that every job write up to seq is applied. Lock held.
func (ix *Index) advance(seq uint64) {
	if seq > ix.covered {
		ix.covered, ix.progress, ix.behind = seq, ix.cfg.Now(), time.Time{}
		ix.wake()
	}
}

// leastRevision is the least revision of a live entry; 0 with none.
// Lock held (or the index not yet shared).
func (ix *Index) leastRevision() uint64 {
	var least uint64
	for _, sl := range ix.byID {
		if !sl.removed && (least == 0 || sl.Revision < least) {
			least = sl.Revision
		}
	}
	return least
}

// wake tells waiting listings that the index moved. Lock held.
func (ix *Index) wake() {
	if ix.changed != nil {
		close(ix.changed)
		ix.changed = nil
	}
}

// slot is one job's entry as the index holds it (136 bytes, allocated in
// the 144-byte size class).
type slot struct {
	JobEntry
	removed bool
}

func newSlot(e JobEntry) *slot {
	sl := &slot{JobEntry: JobEntry{ID: strings.Clone(e.ID)}}
	sl.fill(e)
	return sl
}

// fill sets everything but the id.
func (sl *slot) fill(e JobEntry) {
	e.ID = sl.ID
	e.State, e.Desired = intern(e.State), intern(e.Desired)
	sl.JobEntry = e
}

// intern returns the package's constant for a known state, so that an
// entry does not keep the string its header was decoded into.
func intern(s JobState) JobState {
	for _, k := range JobStates {
		if s == k {
			return k
		}
	}
	return JobState(strings.Clone(string(s)))
}

package supervisor

import (
	"container/heap"
	"strings"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
)

// Record is what the index learns of one job-store write: the KV key
// (job.<id>, whose record holds a small job's steps inline, or
// step.<job>.<step>) and the record headers (protocol.HeaderRecord*).
type Record struct {
	Key string
	// State is the job's state on job.<id>, the step's on a step record.
	State string
	// Desired is the job's desired state (job records).
	Desired string
	// LockedUntil is the earliest lease end of the dispatched steps the
	// record holds; zero when none is dispatched.
	LockedUntil time.Time
	// Written is when the record was written (the message's timestamp).
	Written time.Time
	// Deleted: the key was deleted or purged.
	Deleted bool
	// Deadline is when the job's timeout runs out (job records of jobs
	// with a timeout, until a scheduler acts on it); zero: none.
	Deadline time.Time
}

// Kinds of index entries.
type entryKind uint8

const (
	kindJob     entryKind = iota + 1 // job.<id>
	kindStep                         // step.<job>.<step>
	kindAdvance                      // a job whose advance request failed
)

// entry is one unfinished record. Times are Unix nanoseconds to keep the
// entry small: the index holds one per unfinished record (a million
// queued steps is a million entries), in one map and one heap of
// pointers to the same entries.
type entry struct {
	key     string
	job     string // a substring of key
	step    string // a substring of key (step records)
	kind    entryKind
	pending bool  // a record in state pending (a step, or a job none of whose steps started)
	seen    bool  // job entries: the job's own record was observed
	tries   uint8 // advance requests since the record last moved (recheck)
	active  int32 // job records: unfinished step records of the job
	locked  int64 // earliest lease end in the record; 0: none
	wrote   int64 // last write of the record (jobs: of the job or a step)
	// deadline: the job's timeout runs out then (job records); 0: none.
	deadline int64
	due      int64
	index    int32  // in the heap; -1 when not scheduled
	moved    uint32 // Index.moves when the record last moved (see Due.moved)
}

// Due is an index entry that needs the leader's attention now.
type Due struct {
	Key, Job, Step string
	Kind           entryKind
	// Locked: a lease in the record has ended (else it is a pending step,
	// a stalled job or a failed advance).
	Locked bool
	// moved is the entry's mark of its last move when it came due: the
	// recovery handles an entry while the index goes on observing writes,
	// and an outcome (Recheck, Retry) applies only if the record has not
	// moved since, else the move has scheduled it already.
	moved uint32
}

// Index holds one entry per unfinished job-store record, ordered by when
// each is due: a record with a dispatched step at its earliest lease end,
// a pending step or an unfinished job none of whose step records is
// unfinished after a grace period in which a scheduler should have moved
// it. It is built from record headers alone and never reads the store;
// finished records leave it, so its memory is proportional to the
// unfinished work, not to the store. Not safe for concurrent use.
type Index struct {
	grace      time.Duration
	maxBackoff time.Duration
	entries    map[string]*entry
	heap       entryHeap
	moves      uint32 // counts moves, to mark entries (entry.moved)
}

// NewIndex returns an empty index; grace is how long a pending step or a
// stalled job is left to the schedulers before it is due.
func NewIndex(grace time.Duration) *Index {
	return &Index{grace: grace, maxBackoff: 16 * grace, entries: map[string]*entry{}}
}

// Len is the number of entries scheduled.
func (x *Index) Len() int { return len(x.heap) }

// Size is the number of records held.
func (x *Index) Size() int { return len(x.entries) }

// Next returns the earliest due time, or false if nothing is scheduled.
func (x *Index) Next() (time.Time, bool) {
	if len(x.heap) == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, x.heap[0].due), true
}

// Observe updates the index with one write.
func (x *Index) Observe(r Record) {
	kind, job, step, ok := parseKey(r.Key)
	if !ok {
		return
	}
	e := x.entries[r.Key]
	if r.Deleted || finished(kind, r.State) {
		x.finish(e, r.Written)
		return
	}
	if e == nil {
		e = &entry{key: r.Key, job: job, step: step, kind: kind, index: -1, moved: x.move()}
		x.entries[r.Key] = e
		if kind == kindStep {
			x.jobOf(job).active++
		}
	}
	locked, pending := unixNano(r.LockedUntil), r.State == string(jobstore.StepPending)
	if !e.pending || !pending || e.locked != 0 || locked != 0 {
		// The record moved (a dispatch, a release, an end, a new state):
		// whatever the schedulers were asked before is answered.
		e.tries, e.moved = 0, x.move()
	}
	// Else it was written again still pending and holding no lease: a
	// scheduler noted why the step still waits (its waiting reason), which
	// is no move. The requests asked since stay counted, so the recheck
	// after the last one keeps its short delay (recheck): reset, the
	// scheduler that wrote it and parked the job in its memory was trusted
	// for a whole grace again, and if it died meanwhile (the chaos suite's
	// partitions and kills) the job waited that long for nothing.
	e.locked, e.seen = locked, true
	if kind == kindJob {
		e.deadline = unixNano(r.Deadline)
	}
	e.wrote = max(e.wrote, unixNano(r.Written))
	e.pending = pending
	if kind == kindStep {
		x.touchJob(job, e.wrote)
	}
	x.schedule(e)
}

// finish drops the entry of a record that finished or was deleted.
func (x *Index) finish(e *entry, written time.Time) {
	if e == nil {
		return
	}
	x.unschedule(e)
	delete(x.entries, e.key)
	if e.kind == kindStep {
		if j := x.entries["job."+e.job]; j != nil {
			j.active--
			if j.active <= 0 && !j.seen {
				delete(x.entries, j.key) // known only from its steps
				x.unschedule(j)
				return
			}
			x.touchJob(e.job, unixNano(written))
		}
	}
}

// jobOf returns the entry of a job, creating one for a job whose step
// records arrive before its own record.
func (x *Index) jobOf(job string) *entry {
	key := "job." + job
	e := x.entries[key]
	if e == nil {
		e = &entry{key: key, job: key[len("job."):], kind: kindJob, index: -1, moved: x.move()}
		x.entries[key] = e
	}
	return e
}

// move returns a new mark for an entry whose record moved.
func (x *Index) move() uint32 {
	x.moves++
	return x.moves
}

// touchJob notes activity in a job's step records at wrote.
func (x *Index) touchJob(job string, wrote int64) {
	e := x.entries["job."+job]
	if e == nil {
		return
	}
	if wrote > e.wrote {
		e.wrote = wrote
		e.tries, e.moved = 0, x.move()
	}
	x.schedule(e)
}

// schedule computes when e is due from what it holds.
func (x *Index) schedule(e *entry) {
	due := int64(-1) // not scheduled
	switch {
	case e.locked != 0:
		due = e.locked
	case e.kind == kindJob && e.active > 0:
		// its step records are watched themselves
	case e.kind == kindJob && !e.seen:
		// only known from its steps so far
	case e.kind == kindJob || e.pending:
		due = e.wrote + x.backoff(e.tries)
	}
	// A job with a timeout is asked for at its deadline, which its
	// scheduler acts on (a wake it armed may have gone with it). Only
	// while nothing has been written since: a scheduler that wrote after
	// the deadline has seen it, and asking again at every later write
	// would not help one that ignores it (recheck asks again anyway).
	if e.deadline > e.wrote && (due < 0 || e.deadline < due) {
		due = e.deadline
	}
	if due < 0 {
		x.unschedule(e)
		return
	}
	x.set(e, due)
}

// recheckDivisor: the first recheck after an answered advance request
// comes grace/recheckDivisor after it (3.75 s with the default 30 s).
const recheckDivisor = 8

// backoff is how long a record waits for its next advance request after
// its last move (n = 0: the grace), or after the n-th request since (n ≥
// 1) that did not move it: grace/8 after the first, doubling with each
// request, at most maxBackoff (16 × the grace).
//
// An answer is not a move. The scheduler that answers may have placed
// nothing (every agent busy, higher priority work waiting) and parked the
// job in its memory, where no message is held for it; if that scheduler
// dies or is cut off, nothing moves the job until the next request. The
// backoff used to start at twice the grace, so that a job accepted by a
// scheduler that died, and asked about once more by one that parked it
// and died too, waited 30 s + 60 s before its first step ran (the chaos
// suite's network partitions, seeds 4242 and 31337). Starting small costs
// a job that waits long for an agent four more requests in all (over its
// first 16 × grace), and nothing after: the rate of requests once the
// backoff has reached its bound is the same.
func (x *Index) backoff(n uint8) int64 {
	if n == 0 {
		return int64(x.grace)
	}
	d := x.grace / recheckDivisor
	for i := uint8(1); i < n && d < x.maxBackoff; i++ {
		d *= 2
	}
	return int64(max(min(d, x.maxBackoff), time.Millisecond))
}

// PopDue removes from the schedule and returns every entry due at or
// before now. The entries stay in the index: a later write, Recheck or
// Retry schedules them again.
func (x *Index) PopDue(now time.Time) []Due { return x.PopDueAtMost(now, -1) }

// PopDueAtMost is PopDue returning at most limit entries (a negative
// limit: all), the earliest due first; the others stay scheduled.
func (x *Index) PopDueAtMost(now time.Time, limit int) []Due {
	var out []Due
	n := now.UnixNano()
	for len(x.heap) > 0 && x.heap[0].due <= n && len(out) != limit {
		e := heap.Pop(&x.heap).(*entry)
		out = append(out, Due{Key: e.key, Job: e.job, Step: e.step, Kind: e.kind,
			Locked: e.locked != 0 && e.locked <= n, moved: e.moved})
		if e.kind == kindAdvance {
			delete(x.entries, e.key)
		}
	}
	return out
}

// Recheck schedules an entry whose job was asked to advance and answered:
// if its record does not move (see Observe), it comes due again after the
// next backoff, soon after the first request. A record that moved since d
// came due is scheduled by its move already; one written again without
// moving (a scheduler's waiting reason) is not, and is rechecked.
func (x *Index) Recheck(d Due, now time.Time) {
	if e := x.entries[d.Key]; e != nil && e.moved == d.moved {
		e.tries = min(e.tries+1, 30)
		due := now.UnixNano() + x.backoff(e.tries)
		if e.locked > now.UnixNano() {
			// Asked before its lease ends (at a job's deadline): the
			// lease's end is looked at on time. A lease already past
			// (nothing to release: the index's lease is not the
			// record's) waits the backoff, not a loop of reads.
			due = min(due, e.locked)
		}
		x.set(e, due)
	}
}

// Retry schedules an entry again at due (handling it failed), unless its
// record moved since d came due.
func (x *Index) Retry(d Due, due time.Time) {
	if d.Kind == kindAdvance {
		x.RetryAdvance(d.Job, due)
		return
	}
	if e := x.entries[d.Key]; e != nil && e.moved == d.moved {
		x.set(e, due.UnixNano())
	}
}

// RetryAdvance schedules another advance request for job at due.
func (x *Index) RetryAdvance(job string, due time.Time) {
	key := "advance." + job
	e := x.entries[key]
	if e == nil {
		e = &entry{key: key, job: key[len("advance."):], kind: kindAdvance, index: -1}
		x.entries[key] = e
	}
	x.set(e, due.UnixNano())
}

func (x *Index) set(e *entry, due int64) {
	e.due = due
	if e.index >= 0 {
		heap.Fix(&x.heap, int(e.index))
		return
	}
	heap.Push(&x.heap, e)
}

func (x *Index) unschedule(e *entry) {
	if e != nil && e.index >= 0 {
		heap.Remove(&x.heap, int(e.index))
	}
}

// parseKey splits a job-store key; false for keys that are neither job
// nor step records.
func parseKey(key string) (kind entryKind, job, step string, ok bool) {
	switch {
	case strings.HasPrefix(key, "job."):
		job = key[len("job."):]
		return kindJob, job, "", job != "" && !strings.Contains(job, ".")
	case strings.HasPrefix(key, "step."):
		rest := key[len("step."):]
		i := strings.IndexByte(rest, '.')
		if i <= 0 || i == len(rest)-1 || strings.Contains(rest[i+1:], ".") {
			return 0, "", "", false
		}
		return kindStep, rest[:i], rest[i+1:], true
	}
	return 0, "", "", false
}

// finished reports whether a record in state is done with: a terminal job,
// or a step neither pending nor dispatched. An empty state (a record the
// index cannot read) counts as unfinished, so it is looked at.
func finished(kind entryKind, state string) bool {
	if state == "" {
		return false
	}
	if kind == kindJob {
		return jobstore.JobState(state).Terminal()
	}
	return jobstore.StepState(state).Terminal()
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

type entryHeap []*entry

func (h entryHeap) Len() int           { return len(h) }
func (h entryHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h entryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = int32(i), int32(j)
}
func (h *entryHeap) Push(x any) { e := x.(*entry); e.index = int32(len(*h)); *h = append(*h, e) }
func (h *entryHeap) Pop() any {
	old := *h
	n := len(old)
	e := old[n-1]
	old[n-1] = nil
	*h = old[:n-1]
	e.index = -1
	return e
}

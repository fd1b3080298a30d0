package supervisor

import (
	"container/heap"
	"time"

	"github.com/wardenhq/warden/pkg/jobstore"
)

// Kinds of index items.
const (
	itemStep = iota + 1
	itemJob
)

// item is something that will need the leader's attention at due unless
// the job store says otherwise first.
type item struct {
	kind  int
	job   string
	step  string
	due   time.Time
	index int // in the heap
}

func (it *item) key() string {
	if it.kind == itemJob {
		return "job." + it.job
	}
	return "step." + it.job + "." + it.step
}

type itemHeap []*item

func (h itemHeap) Len() int           { return len(h) }
func (h itemHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h itemHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *itemHeap) Push(x any) { it := x.(*item); it.index = len(*h); *h = append(*h, it) }
func (h *itemHeap) Pop() any {
	old := *h
	n := len(old)
	it := old[n-1]
	old[n-1] = nil
	*h = old[:n-1]
	it.index = -1
	return it
}

// jobInfo is what the index keeps per unfinished job.
type jobInfo struct {
	terminal bool
	// updated is the latest update of the job or any of its steps.
	updated      time.Time
	inconsistent int // steps not in their desired state
	// stepDone is when a step last became consistent while others were
	// not: the job must move on (dispatch or skip dependents) by then +
	// grace, or whoever should have moved it died.
	stepDone time.Time
}

// Index holds the inconsistent steps and jobs ordered by when each is due:
// a dispatched step at its locked_until, a pending step or an unfinished job
// whose steps are all consistent after a grace period in which a scheduler
// should have moved it. It is built from a watch of the job store and kept
// current by it; it never rereads the store. Its memory is proportional to
// the unfinished work, not to the store.
type Index struct {
	grace        time.Duration
	items        map[string]*item
	heap         itemHeap
	jobs         map[string]*jobInfo
	inconsistent map[string]bool // step keys
}

// NewIndex returns an empty index; grace is how long a pending step or a
// stalled job is left to the schedulers.
func NewIndex(grace time.Duration) *Index {
	return &Index{grace: grace, items: map[string]*item{}, jobs: map[string]*jobInfo{}, inconsistent: map[string]bool{}}
}

// Len is the number of items waiting.
func (x *Index) Len() int { return len(x.heap) }

// Next returns the earliest due time, or false if nothing waits.
func (x *Index) Next() (time.Time, bool) {
	if len(x.heap) == 0 {
		return time.Time{}, false
	}
	return x.heap[0].due, true
}

// PopDue removes and returns every item due at or before now.
func (x *Index) PopDue(now time.Time) []*item {
	var out []*item
	for len(x.heap) > 0 && !x.heap[0].due.After(now) {
		it := heap.Pop(&x.heap).(*item)
		delete(x.items, it.key())
		out = append(out, it)
	}
	return out
}

// Defer puts an item back to be looked at again at due.
func (x *Index) Defer(it *item, due time.Time) {
	it.due = due
	x.put(it)
}

func (x *Index) put(it *item) {
	if old, ok := x.items[it.key()]; ok {
		old.due = it.due
		heap.Fix(&x.heap, old.index)
		return
	}
	x.items[it.key()] = it
	heap.Push(&x.heap, it)
}

func (x *Index) remove(key string) {
	if old, ok := x.items[key]; ok {
		heap.Remove(&x.heap, old.index)
		delete(x.items, key)
	}
}

func (x *Index) job(id string) *jobInfo {
	j := x.jobs[id]
	if j == nil {
		j = &jobInfo{}
		x.jobs[id] = j
	}
	return j
}

// ObserveStep updates the index with a step record.
func (x *Index) ObserveStep(s *jobstore.Step) {
	key := "step." + s.JobID + "." + s.ID
	j := x.job(s.JobID)
	if s.UpdatedAt.After(j.updated) {
		j.updated = s.UpdatedAt
	}
	was := x.inconsistent[key]
	is := s.State == jobstore.StepPending || s.State == jobstore.StepDispatched
	switch {
	case is && !was:
		j.inconsistent++
		x.inconsistent[key] = true
	case was && !is:
		j.inconsistent--
		delete(x.inconsistent, key)
		j.stepDone = s.UpdatedAt
	}
	switch s.State {
	case jobstore.StepDispatched:
		x.put(&item{kind: itemStep, job: s.JobID, step: s.ID, due: s.LockedUntil})
	case jobstore.StepPending:
		from := s.UpdatedAt
		if s.NotBefore.After(from) {
			from = s.NotBefore // a retry in its backoff is not stalled
		}
		x.put(&item{kind: itemStep, job: s.JobID, step: s.ID, due: earliest(from.Add(x.grace), s.ExpiresAt)})
	default:
		x.remove(key)
	}
	x.checkJob(s.JobID)
}

// ObserveJob updates the index with a job record.
func (x *Index) ObserveJob(jb *jobstore.Job) {
	j := x.job(jb.ID)
	j.terminal = jb.State.Terminal()
	if jb.UpdatedAt.After(j.updated) {
		j.updated = jb.UpdatedAt
	}
	x.checkJob(jb.ID)
}

// ForgetStep drops a deleted step record.
func (x *Index) ForgetStep(job, step string) {
	key := "step." + job + "." + step
	if x.inconsistent[key] {
		delete(x.inconsistent, key)
		if j := x.jobs[job]; j != nil {
			j.inconsistent--
		}
	}
	x.remove(key)
}

// ForgetJob drops a deleted job record.
func (x *Index) ForgetJob(job string) {
	delete(x.jobs, job)
	x.remove("job." + job)
}

// checkJob schedules a look at an unfinished job none of whose steps is
// in flight (a scheduler died between two steps, or before finishing it),
// and forgets finished jobs.
func (x *Index) checkJob(id string) {
	j := x.jobs[id]
	key := "job." + id
	if j == nil {
		return
	}
	if j.terminal && j.inconsistent == 0 {
		delete(x.jobs, id)
		x.remove(key)
		return
	}
	switch {
	case j.terminal:
		x.remove(key)
	case j.inconsistent == 0 && !j.updated.IsZero():
		x.put(&item{kind: itemJob, job: id, due: j.updated.Add(x.grace)})
	case !j.stepDone.IsZero():
		// Later completions push the check back: only the last matters.
		x.put(&item{kind: itemJob, job: id, due: j.stepDone.Add(x.grace)})
	default:
		x.remove(key)
	}
}

// earliest returns the earlier of a and b, ignoring a zero b.
func earliest(a, b time.Time) time.Time {
	if !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

package supervisor

import "slices"

// recoveryAsks is how many jobs the recovery handles at once. Handling
// one may wait up to advance_timeout for a scheduler's answer; one at a
// time, a hundred due jobs behind a scheduler that swallows its asks
// (blackholed, still in the queue group until the server notices) took
// minutes, and nothing else came due meanwhile.
const recoveryAsks = 32

// recoveryHeld bounds the due entries waiting for a worker. Entries past
// it stay in the index, where writes keep them current, rather than in a
// queue (a takeover can find a million due at once).
const recoveryHeld = 1024

// outcome is one due entry and what handling it came to.
type outcome struct {
	d       Due
	recheck bool
	err     error
}

// jobRound is the due entries of one job, handled in order by one worker
// with at most one advance request.
type jobRound struct {
	job     string
	entries []outcome
}

// asks hands jobRounds to the recovery's workers, one round of a job at a
// time. Used by the recovery loop alone.
type asks struct {
	work   chan *jobRound       // to the workers
	done   chan *jobRound       // back from them
	queue  []*jobRound          // waiting for a worker, oldest first
	queued map[string]*jobRound // the round of each job in queue
	busy   map[string]bool      // jobs with a round out
	// later: entries that came due while their job had a round out.
	later map[string][]outcome
	held  int // entries in queue and later
}

func newAsks() *asks {
	return &asks{work: make(chan *jobRound), done: make(chan *jobRound, recoveryAsks),
		queued: map[string]*jobRound{}, busy: map[string]bool{}, later: map[string][]outcome{}}
}

// room is how many more due entries may be taken now.
func (a *asks) room() int { return recoveryHeld - a.held }

// add takes entries that came due. An entry that comes due again before
// its job's round goes out (a write that is no move rescheduled it)
// replaces the one taken, so that its outcome carries the entry's latest
// mark (Due.moved).
func (a *asks) add(due []Due) {
	for _, d := range due {
		if a.busy[d.Job] {
			a.later[d.Job] = a.put(a.later[d.Job], d)
			continue
		}
		jr := a.queued[d.Job]
		if jr == nil {
			jr = &jobRound{job: d.Job}
			a.queue = append(a.queue, jr)
			a.queued[d.Job] = jr
		}
		jr.entries = a.put(jr.entries, d)
	}
}

// put adds d to entries, or replaces the entry of its key there.
func (a *asks) put(entries []outcome, d Due) []outcome {
	for i := range entries {
		if entries[i].d.Key == d.Key {
			entries[i].d = d
			return entries
		}
	}
	a.held++
	return append(entries, outcome{d: d})
}

// head returns the work channel and the round to send on it, or a nil
// channel (which a select never sends on) when nothing waits.
func (a *asks) head() (chan<- *jobRound, *jobRound) {
	if len(a.queue) == 0 {
		return nil, nil
	}
	return a.work, a.queue[0]
}

// handedOut notes that the head round went to a worker.
func (a *asks) handedOut() {
	jr := a.queue[0]
	a.queue[0] = nil
	a.queue = a.queue[1:]
	delete(a.queued, jr.job)
	a.busy[jr.job] = true
	a.held -= len(jr.entries)
}

// finished notes a round back from its worker and returns its outcomes.
// The entries of its job that came due meanwhile are queued as the next
// round, unless the round failed: then they are returned, to be put back
// in the index after recovery_retry, as the failed entries are (asking
// again at once would skip that wait).
func (a *asks) finished(jr *jobRound) (handled []outcome, retry []Due) {
	delete(a.busy, jr.job)
	l := a.later[jr.job]
	if len(l) == 0 {
		return jr.entries, nil
	}
	delete(a.later, jr.job)
	if slices.ContainsFunc(jr.entries, func(o outcome) bool { return o.err != nil }) {
		a.held -= len(l)
		for _, o := range l {
			retry = append(retry, o.d)
		}
		return jr.entries, retry
	}
	next := &jobRound{job: jr.job, entries: l}
	a.queue = append(a.queue, next)
	a.queued[jr.job] = next
	return jr.entries, nil
}

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
	at      map[string]int // entries by key
}

// put adds d to the round, or replaces the entry of its key there (a write
// that was no move scheduled it again before the round went out), so that
// its outcome carries the entry's latest mark (Due.moved). It reports
// whether the round grew.
func (jr *jobRound) put(d Due) bool {
	if i, ok := jr.at[d.Key]; ok {
		jr.entries[i].d = d
		return false
	}
	if jr.at == nil {
		jr.at = map[string]int{}
	}
	jr.at[d.Key] = len(jr.entries)
	jr.entries = append(jr.entries, outcome{d: d})
	return true
}

// asks hands jobRounds to the recovery's workers, one round of a job at a
// time. Used by the recovery loop alone.
type asks struct {
	work   chan *jobRound       // to the workers
	done   chan *jobRound       // back from them
	queue  []*jobRound          // waiting for a worker, oldest first
	queued map[string]*jobRound // the round of each job in queue
	// out holds the jobs with a round out, each with the round of its
	// entries that came due meanwhile (nil while none has).
	out  map[string]*jobRound
	held int // entries in queue and in out's rounds
}

func newAsks() *asks {
	return &asks{work: make(chan *jobRound), done: make(chan *jobRound, recoveryAsks),
		queued: map[string]*jobRound{}, out: map[string]*jobRound{}}
}

// room is how many more due entries may be taken now.
func (a *asks) room() int { return recoveryHeld - a.held }

// add takes entries that came due.
func (a *asks) add(due []Due) {
	for _, d := range due {
		next, isOut := a.out[d.Job]
		jr := a.queued[d.Job]
		switch {
		case isOut && next == nil:
			next = &jobRound{job: d.Job}
			a.out[d.Job] = next
			jr = next
		case isOut:
			jr = next
		case jr == nil:
			jr = &jobRound{job: d.Job}
			a.queue = append(a.queue, jr)
			a.queued[d.Job] = jr
		}
		if jr.put(d) {
			a.held++
		}
	}
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
	a.out[jr.job] = nil
	a.held -= len(jr.entries)
}

// finished notes a round back from its worker and returns its outcomes.
// The entries of its job that came due meanwhile are queued as the next
// round, unless the round failed: then they are returned, to be put back
// in the index after recovery_retry, as the failed entries are (asking
// again at once would skip that wait).
func (a *asks) finished(jr *jobRound) (handled []outcome, retry []Due) {
	next := a.out[jr.job]
	delete(a.out, jr.job)
	if next == nil {
		return jr.entries, nil
	}
	if slices.ContainsFunc(jr.entries, func(o outcome) bool { return o.err != nil }) {
		a.held -= len(next.entries)
		for _, o := range next.entries {
			retry = append(retry, o.d)
		}
		return jr.entries, retry
	}
	a.queue = append(a.queue, next)
	a.queued[jr.job] = next
	return jr.entries, nil
}

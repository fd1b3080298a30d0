package supervisor

// recoveryAsks is how many jobs the recovery handles at once. Handling
// one may wait up to advance_timeout for a scheduler's answer; one at a
// time, a hundred due jobs behind a scheduler that swallows its asks
// (blackholed, still in the queue group until the server notices) took
// minutes, and nothing else came due meanwhile.
const recoveryAsks = 32

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

// asks hands jobRounds to the recovery's workers: a job's entries are
// handled by one worker at a time, those that come due while it is busy
// in a round after it. Used by the recovery loop alone.
type asks struct {
	work  chan *jobRound // to the workers
	done  chan *jobRound // back from them
	queue []*jobRound    // waiting for a worker, oldest first
	// queued: the round of each job in queue; busy: jobs with a round
	// out; later: entries that came due while their job was busy.
	queued map[string]*jobRound
	busy   map[string]bool
	later  map[string][]outcome
}

func newAsks() *asks {
	return &asks{work: make(chan *jobRound), done: make(chan *jobRound, recoveryAsks),
		queued: map[string]*jobRound{}, busy: map[string]bool{}, later: map[string][]outcome{}}
}

// add queues entries that came due.
func (a *asks) add(due []Due) {
	for _, d := range due {
		switch jr := a.queued[d.Job]; {
		case a.busy[d.Job]:
			a.later[d.Job] = append(a.later[d.Job], outcome{d: d})
		case jr != nil:
			jr.entries = append(jr.entries, outcome{d: d})
		default:
			a.push(&jobRound{job: d.Job, entries: []outcome{{d: d}}})
		}
	}
}

func (a *asks) push(jr *jobRound) {
	a.queue = append(a.queue, jr)
	a.queued[jr.job] = jr
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
}

// finished notes a round back from its worker and returns its outcomes;
// entries of its job that came due meanwhile are queued.
func (a *asks) finished(jr *jobRound) []outcome {
	delete(a.busy, jr.job)
	if l := a.later[jr.job]; len(l) > 0 {
		delete(a.later, jr.job)
		a.push(&jobRound{job: jr.job, entries: l})
	}
	return jr.entries
}

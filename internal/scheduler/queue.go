package scheduler

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// inputKind is what brought a job to its worker.
type inputKind int

const (
	inSubmit    inputKind = iota + 1 // a submission
	inResult                         // an agent's result
	inAdvance                        // an operator or the supervisor asked to advance the job
	inContinue                       // the job has more to do than one slice allowed
	inWake                           // an agent appeared or freed a slot: retry waiting steps
	inGateFreed                      // a concurrency slot the job waits for was freed (workflow.go)
)

// input is one thing for a worker to apply to a job.
type input struct {
	kind inputKind
	job  string
	// msg is the JetStream message (submission or result); it is acked only
	// once every write it caused has landed.
	msg jetstream.Msg
	// req is an advance request to answer.
	req *nats.Msg
	// held are earlier messages of the job, carried by a continue until the
	// job's dispatching is done.
	held []jetstream.Msg

	spec *spec.Job
	// parsed is the submission's spec as parsed on arrival (priority.go),
	// so that its turn does not parse it again.
	parsed *spec.Job
	result *protocol.Result
	// tries counts how often the input met a lost compare-and-set.
	tries int
	at    time.Time
}

// queue is a worker's unbounded FIFO of inputs, in two lanes: results,
// operators' advances and retries first, then submissions and wakes. A
// result frees an agent's slot and may finish a job; taken behind a
// backlog of submissions (each waiting for that very slot), it held the
// slot ~20× longer than the agent did, so agents idled while jobs waited
// for them. Work in progress is finished before new work is started.
//
// It never blocks the feeders: the consumers' max_ack_pending bounds what
// is in flight, and a job stuck behind another never stalls a shared
// stream's head.
type queue struct {
	mu     sync.Mutex
	first  []input
	items  []input
	signal chan struct{}
}

func newQueue() *queue { return &queue{signal: make(chan struct{}, 1)} }

// urgent says whether an input goes in the first lane.
func (in *input) urgent() bool {
	return in.kind == inResult || in.kind == inAdvance || in.tries > 0
}

func (q *queue) push(in ...input) {
	q.mu.Lock()
	for _, x := range in {
		if x.urgent() {
			q.first = append(q.first, x)
		} else {
			q.items = append(q.items, x)
		}
	}
	q.mu.Unlock()
	q.notify()
}

// pushFront puts inputs back at the head of the first lane (a retry after a
// lost CAS).
func (q *queue) pushFront(in ...input) {
	q.mu.Lock()
	q.first = append(append([]input(nil), in...), q.first...)
	q.mu.Unlock()
	q.notify()
}

func (q *queue) notify() {
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// take removes up to n inputs, the first lane's before the other's.
func (q *queue) take(n int) []input {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.first)+len(q.items) == 0 {
		return nil
	}
	out := make([]input, 0, min(n, len(q.first)+len(q.items)))
	out, q.first = takeFrom(out, q.first, n)
	out, q.items = takeFrom(out, q.items, n)
	return out
}

// takeFrom moves up to n-len(out) inputs from the head of lane to out.
func takeFrom(out, lane []input, n int) ([]input, []input) {
	k := min(n-len(out), len(lane))
	if k <= 0 {
		return out, lane
	}
	out = append(out, lane[:k]...)
	if lane = lane[k:]; len(lane) == 0 {
		lane = nil
	}
	return out, lane
}

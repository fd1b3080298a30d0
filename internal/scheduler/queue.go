package scheduler

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	// parsed caches parseSubmission's result: a submission parsed on
	// arrival (priority.go) is not parsed again in its turn.
	parsed *spec.Job
	// tries counts how often the input met a lost compare-and-set.
	tries int
	// reload says the job's cached records are to be read again before
	// this input is applied (dueRetries: a waiter's copy may be stale).
	reload bool
	// tooLarge counts the writes of this input's turns that were larger
	// than the server takes in one message (max_payload): applied again, a
	// submission is refused and a large result (every result, the second
	// time) fails its step without its output (retry).
	tooLarge int
	// slotFreed says a result's agent slot was given back to the selector
	// already (applyResult): a turn retried after a lost compare-and-set
	// applies the result again, and released it twice, one task beyond
	// the agent's max_concurrent until its next heartbeat.
	slotFreed bool
	at        time.Time
}

// queue is a worker's unbounded FIFO of inputs. It never blocks the
// feeders: the consumers' max_ack_pending bounds what is in flight, and a
// job stuck behind another never stalls a shared stream's head.
type queue struct {
	mu     sync.Mutex
	items  []input
	signal chan struct{}
}

func newQueue() *queue { return &queue{signal: make(chan struct{}, 1)} }

func (q *queue) push(in ...input) {
	q.mu.Lock()
	q.items = append(q.items, in...)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// pushFront puts inputs back at the head (a retry after a lost CAS).
func (q *queue) pushFront(in ...input) {
	q.mu.Lock()
	q.items = append(append([]input(nil), in...), q.items...)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// take removes up to n inputs.
func (q *queue) take(n int) []input {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return nil
	}
	k := min(n, len(q.items))
	out := make([]input, k)
	copy(out, q.items[:k])
	q.items = q.items[k:]
	if len(q.items) == 0 {
		q.items = nil
	}
	return out
}

package agent

import "sync"

// recentReports remembers the dispatches ("<job>.<step>.<epoch>") whose
// result this agent stored most recently, so that a redelivery of one is
// acked instead of run again. A result is stored before the task is acked;
// when the ack is lost (the server restarted between the two, or forgot the
// in-memory task consumer the ack was for), the task comes back. Its
// result is already in WARDEN_RESULTS, and running it again would only make
// a duplicate execution for the scheduler to fence. Dispatches are unique
// per epoch, so a key never matches a later attempt of the step.
type recentReports struct {
	mu   sync.Mutex
	keys map[string]struct{}
	ring []string // insertion order; the oldest key is evicted first
	next int
}

// recentReportsKept bounds the memory: far more than the tasks an agent
// finishes in the time a redelivery takes (its lease).
const recentReportsKept = 4096

func newRecentReports(n int) *recentReports {
	return &recentReports{keys: make(map[string]struct{}, n), ring: make([]string, n)}
}

func (r *recentReports) add(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.keys[key]; ok {
		return
	}
	if old := r.ring[r.next]; old != "" {
		delete(r.keys, old)
	}
	r.ring[r.next] = key
	r.keys[key] = struct{}{}
	r.next = (r.next + 1) % len(r.ring)
}

func (r *recentReports) has(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.keys[key]
	return ok
}

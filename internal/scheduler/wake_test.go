package scheduler

import (
	"fmt"
	"testing"
	"time"
)

// A wake retries at most wakeBudget waiting jobs: those with the fewest
// steps in flight, then the longest waiting.
func TestWakeRetriesABoundedFairShare(t *testing.T) {
	w := &worker{waiting: map[string]waiter{}}
	t0 := time.Now()
	for i := range 40 {
		// job-00 .. job-39: the even ones hold a step, the odd ones none;
		// a higher number began to wait later.
		w.waiting[fmt.Sprintf("job-%02d", i)] = waiter{inFlight: (i + 1) % 2, since: t0.Add(time.Duration(i) * time.Millisecond)}
	}
	out := w.expandWakes([]input{{kind: inSubmit, job: "other"}, {kind: inWake}})
	if len(out) != 1+wakeBudget || out[0].job != "other" {
		t.Fatalf("expanded to %d inputs (first %q), want the submission and %d wakes", len(out), out[0].job, wakeBudget)
	}
	for k, in := range out[1:] {
		want := fmt.Sprintf("job-%02d", 2*k+1) // odd ones, oldest first
		if in.kind != inWake || in.job != want {
			t.Fatalf("wake %d is %q, want %q", k, in.job, want)
		}
	}
}

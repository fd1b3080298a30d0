package scheduler

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A wake retries at most wakeBudget waiting jobs: those with the fewest
// steps in flight, then the longest waiting.
func TestWakeRetriesABoundedFairShare(t *testing.T) {
	w := &worker{waiting: map[string]waiter{}, orders: newWaitOrders()}
	t0 := time.Now()
	for i := range 40 {
		// job-00 .. job-39: the even ones hold a step, the odd ones none;
		// a higher number began to wait later.
		w.setWaiter(fmt.Sprintf("job-%02d", i), waiter{inFlight: (i + 1) % 2, since: t0.Add(time.Duration(i) * time.Millisecond)})
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

// BenchmarkWaitingSweep is what a worker pays for its waiting jobs when
// none is due: one wake from a freed slot or a presence change (at most
// every wakeEvery) and one sweep for due retries and extensions (at most
// every sweepEvery), with n jobs waiting for a pool with no agents. Both
// run inside the worker's loop, between the turns of every other job.
func BenchmarkWaitingSweep(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("waiting=%d", n), func(b *testing.B) {
			t0 := time.Now()
			s := &Scheduler{cfg: DefaultConfig(), now: func() time.Time { return t0 }}
			w := newWorker(s)
			for i := range n {
				w.setWaiter(fmt.Sprintf("job-%06d", i), waiter{
					inFlight: i % 3,
					since:    t0.Add(-time.Duration(i) * time.Millisecond),
					retryAt:  t0.Add(time.Hour),
					readAt:   t0,
					extended: t0,
				})
			}
			b.ReportAllocs()
			for b.Loop() {
				if out := w.expandWakes([]input{{kind: inWake}}); len(out) != wakeBudget {
					b.Fatalf("a wake expanded to %d inputs, want %d", len(out), wakeBudget)
				}
				w.lastSweep = time.Time{} // a sweep is due each time
				if out := w.dueRetries(t0); len(out) != 0 {
					b.Fatalf("%d retries due, want none", len(out))
				}
			}
		})
	}
}

// The worker's orders (waitorder.go) answer as a walk of every waiter
// would, through random sets, changes and drops, and stay within a small
// multiple of the waiting jobs.
func TestWaitOrdersAgreeWithAWalk(t *testing.T) {
	t0 := time.Now()
	w := &worker{waiting: map[string]waiter{}, orders: newWaitOrders()}
	rng := rand.New(rand.NewPCG(1, 2))
	at := func() time.Time { return t0.Add(time.Duration(rng.IntN(100)) * time.Millisecond) }
	for round := range 20_000 {
		id := fmt.Sprintf("job-%03d", rng.IntN(300))
		switch op := rng.IntN(10); {
		case op == 0:
			w.dropWaiter(id)
		default:
			wt := w.waiting[id]
			switch rng.IntN(4) {
			case 0:
				wt.retryAt = at()
			case 1:
				wt.gate = !wt.gate
			case 2:
				wt.inFlight, wt.since = rng.IntN(3), at()
			case 3:
				wt.extended = at()
				if rng.IntN(2) == 0 {
					wt.held = nil
				} else {
					wt.held = []jetstream.Msg{&countedMsg{}}
				}
			}
			w.setWaiter(id, wt)
		}
		if round%97 != 0 {
			continue
		}
		now := at()
		// Due: every waiter whose retryAt is not after now, earliest first.
		var due []string
		for id, wt := range w.waiting {
			if !wt.retryAt.After(now) {
				due = append(due, id)
			}
		}
		got := w.dueBy(now, len(w.waiting)+1)
		if len(got) != len(due) {
			t.Fatalf("round %d: %d due, want %d", round, len(got), len(due))
		}
		for k := 1; k < len(got); k++ {
			if w.waiting[got[k]].retryAt.Before(w.waiting[got[k-1]].retryAt) {
				t.Fatalf("round %d: due out of order at %d", round, k)
			}
		}
		// Wake order: the waiters for an agent, fewest in flight, then oldest.
		var wake []string
		for id, wt := range w.waiting {
			if !wt.gate {
				wake = append(wake, id)
			}
		}
		key := func(id string) (int, time.Time) { wt := w.waiting[id]; return wt.inFlight, wt.since }
		slices.SortFunc(wake, func(a, b string) int {
			fa, sa := key(a)
			fb, sb := key(b)
			return cmp.Or(cmp.Compare(fa, fb), sa.Compare(sb))
		})
		first := w.firstToWake(wakeBudget)
		if len(first) != min(len(wake), wakeBudget) {
			t.Fatalf("round %d: %d to wake, want %d", round, len(first), min(len(wake), wakeBudget))
		}
		for k, id := range first {
			fa, sa := key(id)
			fb, sb := key(wake[k])
			if fa != fb || !sa.Equal(sb) {
				t.Fatalf("round %d: wake %d is %s (%d, %v), want one like %s (%d, %v)", round, k, id, fa, sa, wake[k], fb, sb)
			}
		}
		// Extend: those holding messages, extended not after now, each once.
		want := 0
		for _, wt := range w.waiting {
			if len(wt.held) > 0 && !wt.extended.After(now) {
				want++
			}
		}
		before := maps.Clone(w.waiting)
		later := t0.Add(time.Hour + time.Duration(round)) // unlike any earlier round's
		w.extendHeld(later, now)
		n := 0
		for id, wt := range w.waiting {
			if wt.extended.Equal(later) {
				n++
				if !before[id].extended.After(now) && len(before[id].held) > 0 {
					continue
				}
				t.Fatalf("round %d: %s extended, not due", round, id)
			}
		}
		if n != want {
			t.Fatalf("round %d: %d extended, want %d", round, n, want)
		}
		for id, wt := range w.waiting {
			for _, m := range wt.held {
				if c := m.(*countedMsg); c.progress > 1 || (c.progress == 1) != wt.extended.Equal(later) {
					t.Fatalf("round %d: %s's held message told in progress %d times (extended %v)", round, id, c.progress, wt.extended.Equal(later))
				}
				m.(*countedMsg).progress = 0
			}
		}
		o := &w.orders
		if limit := 2*len(w.waiting) + 1024; o.due.Len() > limit || o.extend.Len() > limit || o.wake.Len() > limit {
			t.Fatalf("round %d: orders of %d, %d and %d entries for %d waiting", round, o.due.Len(), o.extend.Len(), o.wake.Len(), len(w.waiting))
		}
	}
}

// countedMsg is a held message as extendHeld sees it: only its
// InProgress is called, and counted.
type countedMsg struct {
	jetstream.Msg
	progress int
}

func (m *countedMsg) InProgress() error { m.progress++; return nil }

// A finished job forgets its steps' places in gates' queues, and a freed
// slot's wake forgets its job's, without a walk of every entry: entries of
// jobs that ended while queued (cancelled, expired) stayed for good, and
// every freed slot in the deployment walked them all.
func TestGatedStepsAreForgottenWithTheirJob(t *testing.T) {
	w := newWorker(&Scheduler{cfg: DefaultConfig(), now: time.Now})
	until := time.Now().Add(time.Minute)
	w.gate("job-a", "s1", until)
	w.gate("job-a", "s2", until)
	w.gate("job-b", "s1", until)
	w.finish(&jobTurn{id: "job-a", js: endedJob(t, 2), finished: true})
	if _, ok := w.gated["job-a"]; ok || len(w.gated["job-b"]) != 1 {
		t.Fatalf("after job-a finished: gated %v, want job-b's step only", w.gated)
	}
	w.gateFreed("job-b")
	if len(w.gated) != 0 {
		t.Fatalf("after job-b's wake: gated %v, want none", w.gated)
	}
	w.gate("job-c", "s1", until)
	w.ungate("job-c", "s1")
	if len(w.gated) != 0 {
		t.Fatalf("after job-c's step asked again: gated %v, want none", w.gated)
	}
}

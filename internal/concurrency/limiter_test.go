package concurrency_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/concurrency"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// clock is a settable clock shared by the test's limiters.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// setup starts a server and returns n limiters on separate connections, as
// n schedulers would have.
func setup(t *testing.T, n int, cfg concurrency.Config) []*concurrency.Limiter {
	t.Helper()
	srv := natstest.New(t)
	ctx := context.Background()
	var out []*concurrency.Limiter
	for i := range n {
		_, js := srv.Connect(t)
		if i == 0 {
			if err := streams.EnsureWorkflow(ctx, js, streams.Options{}); err != nil {
				t.Fatal(err)
			}
		}
		l, err := concurrency.New(ctx, js, cfg)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

func acquire(t *testing.T, l *concurrency.Limiter, key string, limit int, holder string) bool {
	t.Helper()
	ok, retryAt, err := l.Acquire(context.Background(), key, limit, holder, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !ok && retryAt.IsZero() {
		t.Fatalf("%s refused without a retry time", holder)
	}
	return ok
}

// acquireAt is acquire for a step of priority p; it also says when to ask
// again.
func acquireAt(t *testing.T, l *concurrency.Limiter, key string, limit int, holder string, p spec.Priority) (bool, time.Time) {
	t.Helper()
	g, retryAt, err := l.AcquireGrant(context.Background(), key, limit, holder, 10*time.Second, p)
	if err != nil {
		t.Fatal(err)
	}
	if !g.Granted && retryAt.IsZero() {
		t.Fatalf("%s refused without a retry time", holder)
	}
	return g.Granted, retryAt
}

func TestWaitersInOrderAcrossSchedulers(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	ls := setup(t, 2, concurrency.Config{Now: clk.Now})
	a, b := ls[0], ls[1]
	ctx := context.Background()
	if !acquire(t, a, "c-42", 2, "j1.s") || !acquire(t, b, "c-42", 2, "j2.s") {
		t.Fatal("the first two holders were refused")
	}
	if acquire(t, a, "c-42", 2, "j3.s") || acquire(t, b, "c-42", 2, "j4.s") {
		t.Fatal("a third holder was granted with limit 2")
	}
	if !acquire(t, b, "c-42", 2, "j1.s") {
		t.Fatal("a holder asking again must renew, not queue")
	}
	next, err := b.Release(ctx, "c-42", "j1.s")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(next) != "[j3.s]" {
		t.Fatalf("release hands the slot to %v, want the oldest waiter j3.s", next)
	}
	if acquire(t, a, "c-42", 2, "j4.s") {
		t.Fatal("j4 overtook the older waiter j3")
	}
	if acquire(t, a, "c-42", 2, "j5.s") {
		t.Fatal("a newcomer overtook the queue")
	}
	if !acquire(t, b, "c-42", 2, "j3.s") {
		t.Fatal("the oldest waiter was refused a free slot")
	}
	st, err := a.Inspect(ctx, "c-42")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(st.Holders, st.Waiters) != "[j2.s j3.s] [j4.s j5.s]" {
		t.Fatalf("state %+v", st)
	}
	// Independent keys do not interfere.
	if !acquire(t, a, "c-43", 1, "j4.s") {
		t.Fatal("another key is not limited by c-42")
	}
}

// A key's queue is bounded (its holders and waiters are one KV value that
// must fit a message): past MaxWaiters a step is refused with a retry time
// but not queued, and takes a slot once the queue is shorter.
func TestQueueIsBounded(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := setup(t, 1, concurrency.Config{Now: clk.Now, MaxWaiters: 3})[0]
	ctx := context.Background()
	if !acquire(t, l, "k", 1, "j0.s") {
		t.Fatal("the first holder was refused")
	}
	for i := 1; i <= 5; i++ {
		if acquire(t, l, "k", 1, fmt.Sprintf("j%d.s", i)) {
			t.Fatalf("j%d granted with limit 1", i)
		}
	}
	st, err := l.Inspect(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(st.Holders, st.Waiters) != "[j0.s] [j1.s j2.s j3.s]" {
		t.Fatalf("state %v %v, want 3 waiters queued and the rest not", st.Holders, st.Waiters)
	}
	next, err := l.Release(ctx, "k", "j0.s")
	if err != nil || fmt.Sprint(next) != "[j1.s]" {
		t.Fatalf("release woke %v (%v), want the oldest waiter", next, err)
	}
	if acquire(t, l, "k", 1, "j5.s") || !acquire(t, l, "k", 1, "j1.s") {
		t.Fatal("the queue's head must take the freed slot, not an unqueued step")
	}
}

// TestStaleCacheNeverDecides: a limiter writes on the record it cached
// without reading first; when another scheduler changed the key meanwhile,
// neither a write (the CAS refuses it) nor a refusal that writes nothing
// may rest on the stale copy.
func TestStaleCacheNeverDecides(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	ls := setup(t, 2, concurrency.Config{Now: clk.Now})
	a, b := ls[0], ls[1]
	ctx := context.Background()
	if !acquire(t, a, "k", 1, "j1.s") || acquire(t, a, "k", 1, "j2.s") {
		t.Fatal("limit 1: j1 holds, j2 waits")
	}
	// a's cache: j1 holds, j2 waits. b frees j1's slot.
	if next, err := b.Release(ctx, "k", "j1.s"); err != nil || fmt.Sprint(next) != "[j2.s]" {
		t.Fatalf("release: %v %v", next, err)
	}
	// On a's cached copy j2 is still queued (a refusal that writes
	// nothing); on the stored record the slot is j2's.
	if !acquire(t, a, "k", 1, "j2.s") {
		t.Fatal("a refused j2 on its stale copy of the key")
	}
	// b's copy is stale now (a wrote): its write is refused by the CAS and
	// decided again on the stored record.
	if acquire(t, b, "k", 1, "j3.s") {
		t.Fatal("j3 granted beside j2 with limit 1")
	}
	st, err := b.Inspect(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(st.Holders, st.Waiters) != "[j2.s] [j3.s]" {
		t.Fatalf("state %+v", st)
	}
}

func TestCrashedHolderFreedByLease(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	ls := setup(t, 2, concurrency.Config{Now: clk.Now, WaitLease: 30 * time.Second})
	ctx := context.Background()
	// Scheduler 0 grants j1 a 10s slot, then dies without releasing.
	if !acquire(t, ls[0], "k", 1, "j1.s") {
		t.Fatal("refused")
	}
	ok, retryAt, err := ls[1].Acquire(ctx, "k", 1, "j2.s", 10*time.Second)
	if err != nil || ok {
		t.Fatalf("granted=%v err=%v while j1 holds the key", ok, err)
	}
	if want := clk.Now().Add(5 * time.Second); !retryAt.Equal(want) {
		t.Fatalf("retry at %v, want %v (the retry interval, sooner than the lease end)", retryAt, want)
	}
	clk.Add(9 * time.Second)
	if acquire(t, ls[1], "k", 1, "j2.s") {
		t.Fatal("granted before the crashed holder's lease ended")
	}
	clk.Add(2 * time.Second)
	if !acquire(t, ls[1], "k", 1, "j2.s") {
		t.Fatal("the crashed holder's slot was not freed by its lease")
	}
	// A waiter that stops asking drops out of the queue after its wait lease.
	if acquire(t, ls[0], "k", 1, "j3.s") {
		t.Fatal("granted over limit")
	}
	clk.Add(31 * time.Second) // j2's lease and j3's wait lease both end
	if !acquire(t, ls[0], "k", 1, "j4.s") {
		t.Fatal("a silent waiter kept its place forever")
	}
}

// TestNeverOverLimit runs 40 workers per scheduler, of every priority,
// competing for one key with limit 3; each holds its slot briefly and
// records how many hold it at once (as the agents' start/finish records
// would show).
func TestNeverOverLimit(t *testing.T) {
	t.Parallel()
	ls := setup(t, 2, concurrency.Config{RetryAfter: 20 * time.Millisecond})
	const limit, workers = 3, 40
	var running, peak, done atomic.Int64
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for w := range 2 * workers {
		l := ls[w%2]
		wg.Go(func() {
			holder := fmt.Sprintf("job%d.s", w)
			for ctx.Err() == nil {
				g, retryAt, err := l.AcquireGrant(ctx, "hot", limit, holder, 30*time.Second, spec.Priorities[w%len(spec.Priorities)])
				ok := g.Granted
				if errors.Is(err, concurrency.ErrConflict) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					time.Sleep(min(time.Until(retryAt), 20*time.Millisecond))
					continue
				}
				n := running.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(time.Millisecond)
				running.Add(-1)
				for {
					_, err := l.Release(ctx, "hot", holder)
					if err == nil {
						break
					}
					if !errors.Is(err, concurrency.ErrConflict) {
						t.Error(err)
						break
					}
				}
				done.Add(1)
				return
			}
		})
	}
	wg.Wait()
	if done.Load() != 2*workers {
		t.Fatalf("%d of %d workers ran", done.Load(), 2*workers)
	}
	if p := peak.Load(); p > limit {
		t.Fatalf("%d ran at once, limit %d", p, limit)
	}
	t.Logf("%d workers over 2 schedulers, at most %d at once (limit %d)", 2*workers, peak.Load(), limit)
	st, err := ls[0].Inspect(ctx, "hot")
	if err != nil || len(st.Holders)+len(st.Waiters) != 0 || !slices.Equal(st.Holders, nil) {
		t.Fatalf("leftovers %+v %v", st, err)
	}
}

// BenchmarkHandoff: one key, limit 1, 200 waiters queued; each op is a
// handoff as a scheduler does it: the holder releases, the next waiter
// acquires. It reports handoffs/s; it asserts nothing.
func BenchmarkHandoff(b *testing.B) {
	srv := natstest.New(b)
	_, js := srv.Connect(b)
	ctx := context.Background()
	if err := streams.EnsureWorkflow(ctx, js, streams.Options{}); err != nil {
		b.Fatal(err)
	}
	l, err := concurrency.New(ctx, js, concurrency.Config{})
	if err != nil {
		b.Fatal(err)
	}
	const waiters = 200
	holder := func(i int) string { return fmt.Sprintf("job-%06d.s", i) }
	for i := range waiters + 1 {
		if _, _, err := l.Acquire(ctx, "k", 1, holder(i), time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		next, err := l.Release(ctx, "k", holder(i))
		if err != nil || len(next) != 1 {
			b.Fatalf("release: %v %v", next, err)
		}
		if ok, _, err := l.Acquire(ctx, "k", 1, next[0], time.Minute); err != nil || !ok {
			b.Fatalf("acquire %s: %v %v", next[0], ok, err)
		}
		// Keep the queue at its length: a newcomer joins the end.
		if _, _, err := l.Acquire(ctx, "k", 1, holder(i+waiters+1), time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "handoffs/s")
}

// Steps past a full queue are answered from memory for a moment after the
// queue was found full: each asked again every RetryAfter with a read of
// the key's record (up to ~600 KB), so 10,000 of them read one key 2,000
// times a second. A queued step still reads it, and takes a freed slot at
// once.
func TestStepsPastAFullQueueDoNotReadItAgain(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	ctx := context.Background()
	nc, js := srv.Connect(t)
	if err := streams.EnsureWorkflow(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	l, err := concurrency.New(ctx, js, concurrency.Config{MaxWaiters: 3})
	if err != nil {
		t.Fatal(err)
	}
	var reads atomic.Int64
	sub, err := nc.Subscribe("$JS.API.*.*.KV_"+streams.BucketConcurrency+".>", func(*nats.Msg) { reads.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	sub2, err := nc.Subscribe("$JS.API.*.*.*.KV_"+streams.BucketConcurrency, func(*nats.Msg) { reads.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub2.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := range 4 { // j0 holds; j1-j3 fill the queue
		if got := acquire(t, l, "k", 1, fmt.Sprintf("j%d.s", i)); got != (i == 0) {
			t.Fatalf("j%d granted %v", i, got)
		}
	}
	if acquire(t, l, "k", 1, "over-0.s") { // finds the queue full
		t.Fatal("a step past the full queue was granted")
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	before := reads.Load()
	for i := range 200 {
		granted, retryAt, err := l.Acquire(ctx, "k", 1, fmt.Sprintf("over-%d.s", i), 10*time.Second)
		if err != nil || granted || retryAt.Before(time.Now().Add(2*time.Second)) {
			t.Fatalf("over-%d: granted %v, retry at %v (%v); want refused for a few seconds", i, granted, retryAt, err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := reads.Load() - before; n > 4 {
		t.Fatalf("200 steps past the full queue read the key %d times within a second", n)
	}
	// A holder asking again (re-dispatched after its agent died) renews
	// its slot: it was refused from memory, and its slot idled.
	if !acquire(t, l, "k", 1, "j0.s") {
		t.Fatal("the holder was refused its own slot while the queue was full")
	}
	// The queue's head is not answered from memory: a freed slot is its.
	if _, err := l.Release(ctx, "k", "j0.s"); err != nil {
		t.Fatal(err)
	}
	if !acquire(t, l, "k", 1, "j1.s") {
		t.Fatal("the queue's head was refused the freed slot")
	}
}

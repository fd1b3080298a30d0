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

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/concurrency"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/streams"
)

// bucket is a test's view of warden_concurrency beside its limiters.
type bucket struct {
	js jetstream.JetStream
	kv jetstream.KeyValue
	ls []*concurrency.Limiter
}

// setupBucket is setup with the bucket's limit_marker_ttl set to
// markerTTL (the purge markers of removed records expire after it; 0
// keeps the definition's), so that a test can see the markers go.
func setupBucket(t *testing.T, n int, cfg concurrency.Config, markerTTL time.Duration) *bucket {
	t.Helper()
	srv := natstest.New(t)
	ctx := context.Background()
	_, js := srv.Connect(t)
	if err := streams.EnsureWorkflow(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	if markerTTL > 0 {
		kc := concurrencyBucketConfig(t)
		kc.LimitMarkerTTL = markerTTL
		if _, err := js.UpdateKeyValue(ctx, kc); err != nil {
			t.Fatal(err)
		}
	}
	b := &bucket{js: js}
	var err error
	if b.kv, err = js.KeyValue(ctx, streams.BucketConcurrency); err != nil {
		t.Fatal(err)
	}
	for range n {
		_, js := srv.Connect(t)
		l, err := concurrency.New(ctx, js, cfg)
		if err != nil {
			t.Fatal(err)
		}
		b.ls = append(b.ls, l)
	}
	return b
}

func concurrencyBucketConfig(t *testing.T) jetstream.KeyValueConfig {
	t.Helper()
	kvs, err := streams.WorkflowKeyValueConfigs(streams.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range kvs {
		if c.Bucket == streams.BucketConcurrency {
			return c
		}
	}
	t.Fatalf("no %s definition", streams.BucketConcurrency)
	return jetstream.KeyValueConfig{}
}

// keys lists the bucket's live keys (removed ones are not listed).
func (b *bucket) keys(t *testing.T) []string {
	t.Helper()
	kl, err := b.kv.ListKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for k := range kl.Keys() {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// msgs is how many messages the bucket's stream holds: records and the
// markers of removed ones.
func (b *bucket) msgs(t *testing.T) uint64 {
	t.Helper()
	s, err := b.js.Stream(context.Background(), "KV_"+streams.BucketConcurrency)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// noKeys fails unless the bucket holds no live record.
func (b *bucket) noKeys(t *testing.T, when string) {
	t.Helper()
	if ks := b.keys(t); len(ks) > 0 {
		t.Fatalf("%s: the bucket keeps %d records %v, want none", when, len(ks), ks[:min(len(ks), 5)])
	}
}

func release(t *testing.T, l *concurrency.Limiter, key, holder string) []string {
	t.Helper()
	next, err := l.Release(context.Background(), key, holder)
	if err != nil {
		t.Fatal(err)
	}
	return next
}

func holders(t *testing.T, l *concurrency.Limiter, key string) string {
	t.Helper()
	st, err := l.Inspect(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(st.Holders, st.Waiters)
}

// TestEmptyRecordsAreRemoved: keys used once each (per-entity keys such as
// "customer-<id>") leave nothing behind once released, whichever way the
// record became empty, and the markers of the removals expire.
func TestEmptyRecordsAreRemoved(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	b := setupBucket(t, 2, concurrency.Config{Now: clk.Now}, time.Second)
	a, o := b.ls[0], b.ls[1]
	ctx := context.Background()
	// Acquired by one scheduler, released by the same or by another.
	const n = 200
	for i := range n {
		key, holder := fmt.Sprintf("customer-%d", i), fmt.Sprintf("j%d.s", i)
		if !acquire(t, a, key, 1, holder) {
			t.Fatalf("%s refused on a new key", holder)
		}
		rel := a
		if i%2 == 1 {
			rel = o
		}
		release(t, rel, key, holder)
	}
	// Emptied through the queue: a waiter takes the slot, then releases.
	if !acquire(t, a, "q", 1, "j1.s") || acquire(t, o, "q", 1, "j2.s") {
		t.Fatal("limit 1: j1 holds, j2 waits")
	}
	if next := release(t, a, "q", "j1.s"); fmt.Sprint(next) != "[j2.s]" {
		t.Fatalf("woke %v", next)
	}
	if !acquire(t, o, "q", 1, "j2.s") {
		t.Fatal("the woken waiter was refused")
	}
	release(t, a, "q", "j2.s")
	// A waiter that gives up (its job was cancelled) empties it too.
	if !acquire(t, a, "w", 1, "j1.s") || acquire(t, o, "w", 1, "j2.s") {
		t.Fatal("limit 1: j1 holds, j2 waits")
	}
	release(t, o, "w", "j1.s")
	release(t, a, "w", "j2.s")
	// Emptied by leases that ended: whoever touches the key next removes it.
	if !acquire(t, a, "crashed", 1, "j1.s") {
		t.Fatal("refused")
	}
	clk.Add(11 * time.Second) // j1's 10s lease ended: its scheduler died
	release(t, o, "crashed", "j9.s")
	// An empty record as an older version wrote it.
	if _, err := b.kv.Put(ctx, "old", []byte(`{"limit":1}`)); err != nil {
		t.Fatal(err)
	}
	release(t, a, "old", "j1.s")
	b.noKeys(t, "after every holder and waiter left")
	// The purges' markers expire (limit_marker_ttl, 1s here).
	natstest.Eventually(t, 15*time.Second, "the removed records' markers stay in the stream", func() bool {
		return b.msgs(t) == 0
	})
}

// TestRemovalNeverLosesAnAcquire: a scheduler removes a key it sees empty
// while another one acquires it; the removal is a compare-and-set, so the
// acquire stands, and never more than limit hold the key.
func TestRemovalNeverLosesAnAcquire(t *testing.T) {
	t.Parallel()
	b := setupBucket(t, 2, concurrency.Config{RetryAfter: 5 * time.Millisecond}, 0)
	a, o := b.ls[0], b.ls[1]

	// Deterministic: a caches the key with j1 holding; o adds j2; a
	// releases j1 and, on its cached copy, the key is empty: the removal
	// must be refused and decided again on the stored record.
	if !acquire(t, a, "k", 2, "j1.s") || !acquire(t, o, "k", 2, "j2.s") {
		t.Fatal("limit 2: both granted")
	}
	release(t, a, "k", "j1.s")
	if got := holders(t, o, "k"); got != "[j2.s] []" {
		t.Fatalf("after j1's release the key is %s, want j2 still holding", got)
	}
	if acquire(t, a, "k", 1, "j3.s") {
		t.Fatal("j3 granted beside j2 with limit 1")
	}
	// o's copy is stale (a wrote): its write is refused and decided
	// again on the stored record, which it empties of holders: j3 waits on.
	release(t, o, "k", "j2.s")
	if got := holders(t, a, "k"); got != "[] [j3.s]" {
		t.Fatalf("after j2's release the key is %s, want j3 still waiting", got)
	}
	release(t, a, "k", "j3.s")
	b.noKeys(t, "after the last waiter left")
	// a caches the key with j6 holding; o removes it. a's copy is of a
	// removed revision: j7 must not queue behind j6 on it, nor write on it.
	if !acquire(t, a, "k", 1, "j6.s") {
		t.Fatal("j6 refused on a free key")
	}
	release(t, o, "k", "j6.s")
	if !acquire(t, a, "k", 1, "j7.s") {
		t.Fatal("j7 refused on a free key (decided on a removed record)")
	}
	if acquire(t, o, "k", 1, "j8.s") {
		t.Fatal("j8 granted beside j7 with limit 1")
	}
	if got := holders(t, o, "k"); got != "[j7.s] [j8.s]" {
		t.Fatalf("key %s, want j7 holding and j8 waiting", got)
	}
	release(t, o, "k", "j7.s")
	release(t, a, "k", "j8.s")

	// Racing: the key empties and is removed again and again while the
	// other scheduler acquires it. With limit 2 and one worker per
	// scheduler both are always granted: a grant a removal wiped out shows
	// as a holder missing from the stored record. With limit 1 and two
	// workers per scheduler, one wiped out would let two run at once.
	race(t, b, 2, 1, 100)
	race(t, b, 1, 2, 40)
	b.noKeys(t, "after the race")
}

// race runs perScheduler workers on each of b's limiters, each acquiring
// "hot" (limit) rounds times, checking that it is a stored holder and
// that no more than limit run at once, then releasing.
func race(t *testing.T, b *bucket, limit, perScheduler, rounds int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var running, peak atomic.Int64
	var wg sync.WaitGroup
	for w := range len(b.ls) * perScheduler {
		l, other := b.ls[w%len(b.ls)], b.ls[(w+1)%len(b.ls)]
		wg.Go(func() {
			for i := 0; i < rounds && ctx.Err() == nil; {
				holder := fmt.Sprintf("w%d-%d.s", w, i)
				ok, retryAt, err := l.Acquire(ctx, "hot", limit, holder, 30*time.Second)
				if errors.Is(err, concurrency.ErrConflict) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					time.Sleep(min(time.Until(retryAt), 2*time.Millisecond))
					continue
				}
				n := running.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				st, err := other.Inspect(ctx, "hot")
				if err != nil {
					t.Error(err)
					return
				}
				if !slices.Contains(st.Holders, holder) {
					t.Errorf("limit %d: %s was granted but the stored key has holders %v", limit, holder, st.Holders)
				}
				running.Add(-1)
				for {
					_, err := l.Release(ctx, "hot", holder)
					if err == nil {
						break
					}
					if !errors.Is(err, concurrency.ErrConflict) {
						t.Error(err)
						return
					}
				}
				i++
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("limit %d: the workers did not finish in time", limit)
	}
	if p := peak.Load(); p > int64(limit) {
		t.Fatalf("%d held the key at once, limit %d", p, limit)
	}
}

// TestAcquireAfterRemoval: a removed key is taken again, both while its
// removal's marker is stored and after it expired, and the new record
// limits as the first did.
func TestAcquireAfterRemoval(t *testing.T) {
	t.Parallel()
	b := setupBucket(t, 2, concurrency.Config{}, time.Second)
	a, o := b.ls[0], b.ls[1]
	if !acquire(t, a, "k", 1, "j1.s") {
		t.Fatal("refused")
	}
	release(t, a, "k", "j1.s")
	b.noKeys(t, "after the release")
	// Marker stored: the same scheduler and another one take the key.
	if !acquire(t, a, "k", 1, "j2.s") {
		t.Fatal("j2 refused on a removed key")
	}
	if acquire(t, o, "k", 1, "j3.s") {
		t.Fatal("j3 granted beside j2 with limit 1: the key was made twice")
	}
	if got := holders(t, o, "k"); got != "[j2.s] [j3.s]" {
		t.Fatalf("key %s", got)
	}
	release(t, o, "k", "j2.s")
	if !acquire(t, o, "k", 1, "j3.s") {
		t.Fatal("the waiter was refused the freed slot")
	}
	release(t, a, "k", "j3.s")
	b.noKeys(t, "after the second round")
	// Marker expired: nothing stored for the key at all.
	natstest.Eventually(t, 15*time.Second, "the removal's marker stays in the stream", func() bool {
		return b.msgs(t) == 0
	})
	if !acquire(t, o, "k", 1, "j4.s") || acquire(t, a, "k", 1, "j5.s") {
		t.Fatal("limit 1 on a key made again: j4 holds, j5 waits")
	}
	if got := holders(t, a, "k"); got != "[j4.s] [j5.s]" {
		t.Fatalf("key %s", got)
	}
}

// TestBucketWithoutMarkerTTL: a bucket made by an older version (no
// limit_marker_ttl) keeps working as it did, empty records kept; once
// updated (`warden setup`), limiters opened on it remove them, the old
// one's included, beside limiters still running the old way.
func TestBucketWithoutMarkerTTL(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	ctx := context.Background()
	_, js := srv.Connect(t)
	old := concurrencyBucketConfig(t)
	old.LimitMarkerTTL = 0
	if _, err := js.CreateKeyValue(ctx, old); err != nil {
		t.Fatal(err)
	}
	before, err := concurrency.New(ctx, js, concurrency.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if !acquire(t, before, "k", 1, "j1.s") {
		t.Fatal("refused")
	}
	release(t, before, "k", "j1.s")
	if err := streams.EnsureWorkflow(ctx, js, streams.Options{}); err != nil {
		t.Fatalf("update the bucket: %v", err)
	}
	after, err := concurrency.New(ctx, js, concurrency.Config{})
	if err != nil {
		t.Fatal(err)
	}
	release(t, after, "k", "j1.s") // finds the empty record: removes it
	kv, err := js.KeyValue(ctx, streams.BucketConcurrency)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "k"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the empty record is still stored (%v)", err)
	}
	// Both kinds of limiter share the key.
	if !acquire(t, before, "k", 1, "j2.s") || acquire(t, after, "k", 1, "j3.s") {
		t.Fatal("limit 1: j2 holds, j3 waits")
	}
	release(t, before, "k", "j2.s")
	if !acquire(t, after, "k", 1, "j3.s") {
		t.Fatal("the waiter was refused the freed slot")
	}
	release(t, after, "k", "j3.s")
	if _, err := kv.Get(ctx, "k"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the emptied record is still stored (%v)", err)
	}
}

// TestInvalidKeyRefused: a key that is not a KV key is refused before it
// is read (as a subject, a wildcard would read another key's record).
func TestInvalidKeyRefused(t *testing.T) {
	t.Parallel()
	b := setupBucket(t, 1, concurrency.Config{}, 0)
	l := b.ls[0]
	if !acquire(t, l, "a.b", 1, "j1.s") {
		t.Fatal("refused")
	}
	ctx := context.Background()
	for _, key := range []string{"a.*", "a.>", ">", "a b", "", ".a"} {
		if _, _, err := l.Acquire(ctx, key, 1, "j2.s", time.Second); !errors.Is(err, jetstream.ErrInvalidKey) {
			t.Errorf("Acquire(%q): %v, want ErrInvalidKey", key, err)
		}
		if _, err := l.Release(ctx, key, "j1.s"); !errors.Is(err, jetstream.ErrInvalidKey) {
			t.Errorf("Release(%q): %v, want ErrInvalidKey", key, err)
		}
	}
	if got := holders(t, l, "a.b"); got != "[j1.s] []" {
		t.Fatalf("key a.b %s", got)
	}
}

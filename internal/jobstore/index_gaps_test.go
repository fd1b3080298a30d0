package jobstore_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// A stall was measured from the follower's last applied write, not from
// when a listing found it behind. After a quiet spell longer than Stall,
// one delivery slower than CatchUp (here a 400 ms pause) had the first
// listing that saw it abort the follower and rebuild the whole index (a
// scan of every job), though the follower was behind for a moment.
// (Found by a reviewer.)
//
// Old code: "a follower behind for 100 ms after a quiet spell was taken
// for stalled: {… Builds:2 …}".
func TestIndexQuietThenOneSlowDeliveryIsNoStall(t *testing.T) {
	t.Parallel()
	f := newListFixture(t, 50)
	var skew atomic.Int64 // the index's clock runs ahead of the wall by this
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	ix := startIndex(t, f.js, jobstore.IndexConfig{CatchUp: 100 * time.Millisecond, Stall: time.Second, Backoff: 10 * time.Millisecond, Now: now})
	name := follower(t, f.js)
	skew.Add(int64(1500 * time.Millisecond)) // the scenario: no job write for longer than Stall
	if _, err := f.js.PauseConsumer(testCtx(t), "KV_"+protocol.BucketJobs, name, time.Now().Add(400*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	j := jobstore.NewJob("slow", spec.Job{Name: "p", Steps: []spec.Step{{ID: "a", Action: "echo"}}}, time.Now())
	if _, err := f.store.CreateJob(testCtx(t), j); err != nil {
		t.Fatal(err)
	}
	if _, err := ix.store.List(testCtx(t), f.js, jobstore.ListFilter{Limit: 1}); err != nil {
		t.Fatal(err)
	}
	// Once the pause ends, a listing is answered from the index again: by
	// the same build, had the first listing not taken the follower for
	// stalled.
	natstest.Eventually(t, 10*time.Second, "a listing answered from the index", func() bool {
		before := ix.ix.Status().Indexed
		_, err := ix.store.List(testCtx(t), f.js, jobstore.ListFilter{Limit: 1})
		return err == nil && ix.ix.Status().Indexed > before
	})
	if s := ix.ix.Status(); s.Builds != 1 {
		t.Fatalf("a follower behind for 100 ms after a quiet spell was taken for stalled: %+v", s)
	}
}

// The stream purged whole, then one job written before the next listing:
// the stream had messages and a last sequence past the index's, so the
// index was kept, listing the 80 purged jobs for good (a purge writes no
// markers). The stream's first message past a live entry's revision now
// rebuilds it. (Found by a reviewer.)
//
// Old code: "after a purge and one write: matched 81, page 50 jobs …
// (scan would say 1)".
func TestIndexOfAPurgedStreamIsRebuilt(t *testing.T) {
	t.Parallel()
	f := newListFixture(t, 80)
	ix := startIndex(t, f.js, jobstore.IndexConfig{Backoff: 10 * time.Millisecond})
	s, err := f.js.Stream(testCtx(t), "KV_"+protocol.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	j := jobstore.NewJob("after-purge", spec.Job{Name: "p", Steps: []spec.Step{{ID: "a", Action: "echo"}}}, time.Now())
	if _, err := f.store.CreateJob(testCtx(t), j); err != nil {
		t.Fatal(err)
	}
	p, err := ix.store.List(testCtx(t), f.js, jobstore.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Matched != 1 {
		t.Fatalf("after a purge and one write: matched %d, page %d jobs, counts %v (scan would say 1)", p.Matched, len(p.Jobs), p.Counts)
	}
}

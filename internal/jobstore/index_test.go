package jobstore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// indexed is a second Store on the fixture's bucket that answers listings
// from an Index run until the test ends.
type indexed struct {
	store *jobstore.Store
	ix    *jobstore.Index
	done  chan struct{}
	stop  context.CancelFunc
}

func startIndex(t testing.TB, js jetstream.JetStream, cfg jobstore.IndexConfig) indexed {
	t.Helper()
	st, err := jobstore.Open(testCtx(t), js)
	if err != nil {
		t.Fatal(err)
	}
	ix := jobstore.NewIndex(st, js, cfg)
	st.UseIndex(ix)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ix.Run(ctx)
	}()
	t.Cleanup(func() { stop(); <-done })
	natstest.Eventually(t, 30*time.Second, "the index is built", func() bool { return ix.Status().Ready })
	return indexed{store: st, ix: ix, done: done, stop: stop}
}

// samePages walks the pages of lf on both stores (every page, or the
// first maxPages), the indexed one first, and fails unless each page is
// the same, byte for byte as the API sends it (entries, records, Matched,
// Counts, Scanned, Next): the cursors are then the same strings, so either
// store continues the other's listing.
func samePages(t *testing.T, js jetstream.JetStream, plain *jobstore.Store, ix indexed, what string, lf jobstore.ListFilter, maxPages ...int) []string {
	t.Helper()
	before := ix.ix.Status()
	var ids []string
	pages := 0
	for {
		got, err := ix.store.List(testCtx(t), js, lf)
		if err != nil {
			t.Fatalf("%s: indexed: %v", what, err)
		}
		want, err := plain.List(testCtx(t), js, lf)
		if err != nil {
			t.Fatalf("%s: scan: %v", what, err)
		}
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		if !bytes.Equal(g, w) {
			i := 0
			for i < min(len(g), len(w)) && g[i] == w[i] {
				i++
			}
			from := max(0, i-200)
			t.Fatalf("%s, page %d (cursor %q), from byte %d:\nindexed %.500s\nscan    %.500s", what, pages+1, lf.Cursor, from, g[from:], w[from:])
		}
		pages++
		for _, j := range got.Jobs {
			ids = append(ids, j.ID)
		}
		if got.Next == "" || (len(maxPages) > 0 && pages == maxPages[0]) {
			break
		}
		lf.Cursor = got.Next
	}
	after := ix.ix.Status()
	if n := after.Indexed - before.Indexed; n != uint64(pages) || after.Fallbacks != before.Fallbacks {
		t.Fatalf("%s: %d of %d pages answered by the index, %d fallbacks", what, n, pages, after.Fallbacks-before.Fallbacks)
	}
	return ids
}

// TestIndexListsAsTheScanDoes: on the same data, a listing answered by
// the index is the scan's, page for page: every filter, cursor and count,
// and after a job changes state, jobs are added, deleted, purged, and one's
// retention TTL ends (the server's expiry marker).
func TestIndexListsAsTheScanDoes(t *testing.T) {
	t.Parallel()
	const n = 600
	f := newListFixture(t, n)
	// A CatchUp no busy test machine reaches: every listing here must be
	// answered by the index (samePages checks).
	ix := startIndex(t, f.js, jobstore.IndexConfig{CatchUp: 10 * time.Second})
	if s := ix.ix.Status(); s.Entries != n || s.Builds != 1 {
		t.Fatalf("built: %+v, want %d entries", s, n)
	}
	all := func(what string) {
		t.Helper()
		window := func(a, b int) (time.Time, time.Time) {
			return f.base.Add(time.Duration(a) * time.Second), f.base.Add(time.Duration(b) * time.Second)
		}
		after, before := window(n-400, n-100)
		for _, c := range []struct {
			name     string
			lf       jobstore.ListFilter
			maxPages int
		}{
			{"everything", jobstore.ListFilter{Limit: 150}, 0},
			{"default pages", jobstore.ListFilter{}, 3},
			{"running", jobstore.ListFilter{States: []jobstore.JobState{jobstore.JobRunning}, Limit: 30}, 0},
			{"failed or cancelled, twice named", jobstore.ListFilter{States: []jobstore.JobState{jobstore.JobFailed, jobstore.JobCancelled, jobstore.JobFailed}, Limit: 70}, 0},
			{"no such state", jobstore.ListFilter{States: []jobstore.JobState{"nope"}}, 0},
			{"created after", jobstore.ListFilter{CreatedAfter: after, Limit: 133}, 0},
			{"created before", jobstore.ListFilter{CreatedBefore: before, Limit: 100}, 2},
			{"window and states", jobstore.ListFilter{CreatedAfter: after, CreatedBefore: before,
				States: []jobstore.JobState{jobstore.JobSucceeded, jobstore.JobPending}, Limit: 47}, 0},
			{"empty window", jobstore.ListFilter{CreatedAfter: before, CreatedBefore: after}, 0},
			{"past the newest", jobstore.ListFilter{CreatedAfter: f.base.Add(10 * n * time.Second)}, 0},
		} {
			samePages(t, f.js, f.store, ix, what+": "+c.name, c.lf, c.maxPages)
		}
	}
	all("as built")

	// A running job succeeds: a terminal write, with its retention TTL.
	var running string // the newest running job but one
	for i := n - 2; running == ""; i-- {
		if f.state[f.ids[i]] == jobstore.JobRunning {
			running = f.ids[i]
		}
	}
	j, rev, err := f.store.Job(testCtx(t), running)
	if err != nil || j.State != jobstore.JobRunning {
		t.Fatalf("job %s: %v %v", running, j, err)
	}
	j.State = jobstore.JobSucceeded
	if _, err := f.store.UpdateJob(testCtx(t), j, rev); err != nil {
		t.Fatal(err)
	}
	// New jobs, one created before every other (its place is first in
	// the index's order, not last).
	for i, created := range []time.Time{f.base.Add(-time.Hour), f.base.Add(n * time.Second), f.base.Add(n * time.Second)} {
		nj := jobstore.NewJob(fmt.Sprintf("new-%d", i), spec.Job{Name: "new", Steps: []spec.Step{{ID: "a", Action: "echo"}}}, created)
		if _, err := f.store.CreateJob(testCtx(t), nj); err != nil {
			t.Fatal(err)
		}
	}
	// One deleted, one purged.
	if err := f.store.KV().Delete(testCtx(t), protocol.JobKey(f.ids[10])); err != nil {
		t.Fatal(err)
	}
	if err := f.store.KV().Purge(testCtx(t), protocol.JobKey(f.ids[n-1])); err != nil {
		t.Fatal(err)
	}
	ids := samePages(t, f.js, f.store, ix, "succeeded", jobstore.ListFilter{States: []jobstore.JobState{jobstore.JobSucceeded}, Limit: jobstore.MaxListLimit})
	if !slices.Contains(ids, running) {
		t.Fatalf("succeeded: %s missing", running)
	}
	ids = samePages(t, f.js, f.store, ix, "every job", jobstore.ListFilter{Limit: jobstore.MaxListLimit})
	if len(ids) != n+1 || slices.Contains(ids, f.ids[10]) || slices.Contains(ids, f.ids[n-1]) || ids[len(ids)-1] != "new-0" {
		t.Fatalf("every job: %d listed (want %d), the deleted or purged job among them, or new-0 not last", len(ids), n+1)
	}

	// A finished job whose retention ends: the server removes the record
	// and leaves a marker, which the index follows.
	done := jobstore.NewJob("short-lived", spec.Job{Name: "short", Steps: []spec.Step{{ID: "a", Action: "echo"}}}, f.base.Add(time.Duration(n/2)*time.Second+time.Second/2))
	done.State, done.FinishedAt = jobstore.JobSucceeded, time.Now()
	w := f.store.JobWrite(done, 0).WithTTL(5 * time.Second)
	if _, err := f.js.PublishMsg(testCtx(t), w.Msg); err != nil {
		t.Fatalf("a record with a TTL: %v", err)
	}
	// Listed until it expires (not compared with a scan: the record may
	// expire between the two listings).
	p, err := ix.store.List(testCtx(t), f.js, jobstore.ListFilter{Limit: 1, CreatedAfter: done.CreatedAt, CreatedBefore: done.CreatedAt.Add(time.Nanosecond)})
	if err != nil || len(p.Jobs) != 1 || p.Jobs[0].ID != "short-lived" || p.Jobs[0].ExpiresAt.IsZero() {
		t.Fatalf("the short-lived job: %+v %v", p.Jobs, err)
	}
	natstest.Eventually(t, 20*time.Second, "the short-lived job expires", func() bool {
		_, _, err := f.store.Job(testCtx(t), "short-lived")
		return errors.Is(err, jobstore.ErrNotFound)
	})
	ids = samePages(t, f.js, f.store, ix, "after the expiry", jobstore.ListFilter{States: []jobstore.JobState{jobstore.JobSucceeded}, Limit: jobstore.MaxListLimit})
	if slices.Contains(ids, "short-lived") {
		t.Fatal("an expired job is listed")
	}
	all("after the writes and the expiry")
	if s := ix.ix.Status(); s.Entries != n+1 || s.Builds != 1 || s.Fallbacks != 0 {
		t.Fatalf("status %+v: want %d entries, one build, no fallback", s, n+1)
	}
}

// A job written just before a listing is in it: the listing makes sure
// the index has applied every write stored before it began, and is not
// served from an index a write behind.
func TestIndexListingSeesTheWriteBeforeIt(t *testing.T) {
	t.Parallel()
	f := newListFixture(t, 200)
	ctx := testCtx(t)
	// A CatchUp no busy test machine reaches: every listing must be
	// answered by the index, and see the write.
	ix := startIndex(t, f.js, jobstore.IndexConfig{CatchUp: 10 * time.Second})
	for i := range 50 {
		id := fmt.Sprintf("fresh-%02d", i)
		j := jobstore.NewJob(id, spec.Job{Name: id, Steps: []spec.Step{{ID: "a", Action: "echo"}}}, time.Now())
		if _, err := f.store.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
		p, err := ix.store.List(ctx, f.js, jobstore.ListFilter{Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Jobs) != 1 || p.Jobs[0].ID != id || p.Matched != 201+i {
			t.Fatalf("listing %d: %+v, want %s first of %d", i, p.Jobs, id, 201+i)
		}
	}
	if s := ix.ix.Status(); s.Indexed != 50 || s.Fallbacks != 0 {
		t.Fatalf("status %+v: want 50 listings from the index", s)
	}
}

// Until the index is built, a Store given it scans, and says so.
func TestIndexFallsBackUntilBuilt(t *testing.T) {
	t.Parallel()
	f := newListFixture(t, 120)
	st, err := jobstore.Open(testCtx(t), f.js)
	if err != nil {
		t.Fatal(err)
	}
	ix := jobstore.NewIndex(st, f.js, jobstore.IndexConfig{})
	st.UseIndex(ix) // not running
	got, err := st.List(testCtx(t), f.js, jobstore.ListFilter{Limit: 30})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := f.store.List(testCtx(t), f.js, jobstore.ListFilter{Limit: 30})
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if !bytes.Equal(g, w) || got.Matched != 120 {
		t.Fatalf("before the build:\n%.300s\nwant\n%.300s", g, w)
	}
	if s := ix.Status(); s.Ready || s.Fallbacks != 1 || s.Indexed != 0 {
		t.Fatalf("status %+v: want one fallback", s)
	}
}

// follower finds the index's consumer on the jobs stream.
func follower(t *testing.T, js jetstream.JetStream) string {
	t.Helper()
	var name string
	natstest.Eventually(t, 10*time.Second, "the index's follower exists", func() bool {
		s, err := js.Stream(testCtx(t), "KV_"+protocol.BucketJobs)
		if err != nil {
			return false
		}
		l := s.ListConsumers(testCtx(t))
		for ci := range l.Info() {
			if ci.Config.DeliverPolicy == jetstream.DeliverByStartSequencePolicy && ci.Config.HeadersOnly {
				name = ci.Name
			}
		}
		return name != ""
	})
	return name
}

// A follower that stops delivering (its consumer paused on the server):
// a listing finds the write it has not applied, waits CatchUp, and scans;
// the follower, behind and silent for Stall, is ended and the index
// rebuilt, after which listings are answered from it again.
func TestIndexStalledFollowerFallsBackAndRebuilds(t *testing.T) {
	t.Parallel()
	f := newListFixture(t, 300)
	ctx := testCtx(t)
	ix := startIndex(t, f.js, jobstore.IndexConfig{CatchUp: 200 * time.Millisecond, Stall: 100 * time.Millisecond, Backoff: 10 * time.Millisecond})
	name := follower(t, f.js)
	if _, err := f.js.PauseConsumer(ctx, "KV_"+protocol.BucketJobs, name, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	j := jobstore.NewJob("while-paused", spec.Job{Name: "p", Steps: []spec.Step{{ID: "a", Action: "echo"}}}, time.Now())
	if _, err := f.store.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	p, err := ix.store.List(ctx, f.js, jobstore.ListFilter{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Jobs) != 1 || p.Jobs[0].ID != "while-paused" || p.Matched != 301 {
		t.Fatalf("listing with the follower stalled: %+v (matched %d)", p.Jobs, p.Matched)
	}
	if s := ix.ix.Status(); s.Fallbacks != 1 {
		t.Fatalf("status %+v: want the listing to have scanned", s)
	}
	natstest.Eventually(t, 20*time.Second, "the index is rebuilt", func() bool {
		s := ix.ix.Status()
		return s.Ready && s.Builds >= 2
	})
	ids := samePages(t, f.js, f.store, ix, "rebuilt", jobstore.ListFilter{Limit: 100})
	if ids[0] != "while-paused" {
		t.Fatalf("rebuilt: first %s", ids[0])
	}
}

// The connection lost (nats-server restarting), the index is dropped,
// listings scan, and it is rebuilt once the connection is back, with
// what was written meanwhile. When Run ends, its follower's consumer is
// deleted.
func TestIndexRebuildsAfterTheServerRestarts(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	nc, js := srv.ConnectReconnecting(t, 50*time.Millisecond)
	srv.Ensure(t, js, streams.Options{TaskShards: 1})
	plain, err := jobstore.Open(testCtx(t), js)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(id string) {
		t.Helper()
		j := jobstore.NewJob(id, spec.Job{Name: id, Steps: []spec.Step{{ID: "a", Action: "echo"}}}, time.Now())
		if _, err := plain.CreateJob(testCtx(t), j); err != nil {
			t.Fatal(err)
		}
	}
	mk("before")
	ix := startIndex(t, js, jobstore.IndexConfig{Backoff: 10 * time.Millisecond})
	follower(t, js)

	srv.Down()
	natstest.Eventually(t, 10*time.Second, "the index is dropped", func() bool { return !ix.ix.Status().Ready })
	srv.Up(t)
	natstest.Eventually(t, 20*time.Second, "reconnected", nc.IsConnected)
	mk("after")
	natstest.Eventually(t, 20*time.Second, "the index is rebuilt", func() bool {
		s := ix.ix.Status()
		return s.Ready && s.Builds >= 2
	})
	ids := samePages(t, js, plain, ix, "after the restart", jobstore.ListFilter{})
	if !slices.Equal(ids, []string{"after", "before"}) {
		t.Fatalf("after the restart: %v", ids)
	}

	ix.stop()
	<-ix.done
	if s := ix.ix.Status(); s.Ready || s.Entries != 0 {
		t.Fatalf("stopped: %+v", s)
	}
	natstest.Eventually(t, 10*time.Second, "the follower's consumer is deleted", func() bool {
		s, err := js.Stream(testCtx(t), "KV_"+protocol.BucketJobs)
		if err != nil {
			return false
		}
		n := 0
		for ci := range s.ListConsumers(testCtx(t)).Info() {
			if ci.Config.DeliverPolicy == jetstream.DeliverByStartSequencePolicy {
				n++
			}
		}
		return n == 0
	})
	// A stopped index is not answered from.
	before := ix.ix.Status().Fallbacks
	if _, err := ix.store.List(testCtx(t), js, jobstore.ListFilter{}); err != nil {
		t.Fatal(err)
	}
	if ix.ix.Status().Fallbacks != before+1 {
		t.Fatal("a stopped index answered a listing")
	}
}

// The jobs stream purged whole (an operator's `nats stream purge`): the
// next listing is right (empty), and the index is rebuilt, not served
// with the jobs it held.
func TestIndexAfterTheStreamIsPurged(t *testing.T) {
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
	p, err := ix.store.List(testCtx(t), f.js, jobstore.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Jobs) != 0 || p.Matched != 0 || len(p.Counts) != 0 {
		t.Fatalf("after the purge: %d jobs, matched %d, counts %v", len(p.Jobs), p.Matched, p.Counts)
	}
	natstest.Eventually(t, 20*time.Second, "the index holds no job", func() bool {
		s := ix.ix.Status()
		return s.Ready && s.Entries == 0
	})
	j := jobstore.NewJob("after-purge", spec.Job{Name: "p", Steps: []spec.Step{{ID: "a", Action: "echo"}}}, time.Now())
	if _, err := f.store.CreateJob(testCtx(t), j); err != nil {
		t.Fatal(err)
	}
	if ids := samePages(t, f.js, f.store, ix, "after the purge", jobstore.ListFilter{}); !slices.Equal(ids, []string{"after-purge"}) {
		t.Fatalf("after the purge: %v", ids)
	}
}

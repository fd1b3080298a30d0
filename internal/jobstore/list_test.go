package jobstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// listFixture is a store of n jobs written as the job store writes them:
// a JSON record with the record headers. Job i was created at base+i
// seconds and is in states[i%len(states)].
type listFixture struct {
	js    jetstream.JetStream
	store *jobstore.Store
	base  time.Time
	ids   []string // by creation, oldest first
	state map[string]jobstore.JobState
}

var listStates = []jobstore.JobState{jobstore.JobSucceeded, jobstore.JobSucceeded, jobstore.JobFailed, jobstore.JobRunning, jobstore.JobCancelled, jobstore.JobPending}

func newListFixture(t testing.TB, n int) listFixture {
	t.Helper()
	st, js := newStore(t)
	f := listFixture{js: js, store: st, base: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), state: map[string]jobstore.JobState{}}
	msgs := make([]*nats.Msg, 0, n)
	for i := range n {
		id := fmt.Sprintf("job-%05d", i)
		state := listStates[i%len(listStates)]
		created := f.base.Add(time.Duration(i) * time.Second)
		j := &jobstore.Job{ID: id, Name: "n" + id, Spec: spec.Job{Name: "n" + id, Steps: []spec.Step{{ID: "a", Action: "echo"}}},
			Desired: jobstore.JobSucceeded, State: state, CreatedAt: created, UpdatedAt: created}
		b, _ := json.Marshal(j)
		m := nats.NewMsg("$KV." + protocol.BucketJobs + "." + protocol.JobKey(id))
		m.Data = b
		m.Header.Set(protocol.HeaderRecordState, string(state))
		m.Header.Set(protocol.HeaderRecordDesired, string(j.Desired))
		m.Header.Set(protocol.HeaderRecordCreated, created.Format(time.RFC3339Nano))
		msgs = append(msgs, m)
		f.ids = append(f.ids, id)
		f.state[id] = state
	}
	// In windows, each waited for: 20,000 publishes at once stalled the
	// client ("too many outstanding async published messages") on a busy
	// machine.
	natstest.PublishAll(t, js, msgs...)
	return f
}

// newStore is a job store on a fresh server with Warden's streams.
func newStore(t testing.TB) (*jobstore.Store, jetstream.JetStream) {
	t.Helper()
	_, _, js := natstest.Start(t, streams.Options{TaskShards: 1})
	st, err := jobstore.Open(testCtx(t), js)
	if err != nil {
		t.Fatal(err)
	}
	return st, js
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// expected lists the fixture's ids that pass keep, newest first.
func (f listFixture) expected(keep func(i int, id string) bool) []string {
	var out []string
	for i := len(f.ids) - 1; i >= 0; i-- {
		if keep(i, f.ids[i]) {
			out = append(out, f.ids[i])
		}
	}
	return out
}

// walk lists every page and returns the ids in order.
func walk(t *testing.T, f listFixture, lf jobstore.ListFilter) ([]string, int) {
	t.Helper()
	var got []string
	pages := 0
	for {
		p, err := f.store.List(testCtx(t), f.js, lf)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, j := range p.Jobs {
			if j.Job == nil || j.Job.ID != j.ID || j.Job.State != j.State {
				t.Fatalf("page entry %s: record %+v", j.ID, j.Job)
			}
			got = append(got, j.ID)
		}
		if p.Next == "" {
			return got, pages
		}
		lf.Cursor = p.Next
	}
}

// TestListTwentyThousandJobs shows the listing path on 20,000 finished and
// running jobs: filters by state and age, pages that neither skip nor
// repeat a job, and counts by state, reading the page's records only.
func TestListTwentyThousandJobs(t *testing.T) {
	t.Parallel()
	const n = 20000
	f := newListFixture(t, n)
	ctx := testCtx(t)

	start := time.Now()
	p, err := f.store.List(ctx, f.js, jobstore.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first page of %d jobs in %s (reported, not asserted)", n, time.Since(start).Round(time.Millisecond))
	if p.Matched != n || p.Scanned != n || len(p.Jobs) != jobstore.DefaultListLimit || p.Next == "" {
		t.Fatalf("first page: matched %d scanned %d jobs %d next %q", p.Matched, p.Scanned, len(p.Jobs), p.Next)
	}
	if p.Jobs[0].ID != f.ids[n-1] || p.Jobs[49].ID != f.ids[n-50] {
		t.Fatalf("first page is not newest first: %s .. %s", p.Jobs[0].ID, p.Jobs[49].ID)
	}
	want := map[jobstore.JobState]int{}
	for _, s := range f.state {
		want[s]++
	}
	for s, c := range want {
		if p.Counts[s] != c {
			t.Fatalf("counts[%s] = %d, want %d", s, p.Counts[s], c)
		}
	}

	// Running jobs, every page.
	got, pages := walk(t, f, jobstore.ListFilter{States: []jobstore.JobState{jobstore.JobRunning}, Limit: 700})
	exp := f.expected(func(_ int, id string) bool { return f.state[id] == jobstore.JobRunning })
	if !slices.Equal(got, exp) {
		t.Fatalf("running: got %d ids over %d pages, want %d", len(got), pages, len(exp))
	}
	if pages != (len(exp)+699)/700 {
		t.Fatalf("running: %d pages for %d jobs of 700", pages, len(exp))
	}

	// Failed or cancelled, created in a window: the last hour of the fixture
	// but not its last ten minutes.
	after, before := f.base.Add(time.Duration(n-3600)*time.Second), f.base.Add(time.Duration(n-600)*time.Second)
	got, _ = walk(t, f, jobstore.ListFilter{
		States:       []jobstore.JobState{jobstore.JobFailed, jobstore.JobCancelled},
		CreatedAfter: after, CreatedBefore: before, Limit: 100,
	})
	exp = f.expected(func(i int, id string) bool {
		s := f.state[id]
		return (s == jobstore.JobFailed || s == jobstore.JobCancelled) && i >= n-3600 && i < n-600
	})
	if len(exp) == 0 || !slices.Equal(got, exp) {
		t.Fatalf("failed|cancelled in window: got %d, want %d", len(got), len(exp))
	}

	if _, err := f.store.List(ctx, f.js, jobstore.ListFilter{Cursor: "not a cursor!"}); !errors.Is(err, jobstore.ErrBadCursor) {
		t.Fatalf("bad cursor: %v", err)
	}
}

// TestListEdges: an empty store, deleted jobs, step keys, records written
// without headers (read in full) and a finished job's retention.
func TestListEdges(t *testing.T) {
	t.Parallel()
	f := newListFixture(t, 0)
	ctx := testCtx(t)
	p, err := f.store.List(ctx, f.js, jobstore.ListFilter{})
	if err != nil || p.Matched != 0 || len(p.Jobs) != 0 || p.Next != "" {
		t.Fatalf("empty store: %+v %v", p, err)
	}

	// Steps only: still no job.
	if _, err := f.store.CreateStep(ctx, &jobstore.Step{JobID: "x", ID: "a", State: jobstore.StepPending}); err != nil {
		t.Fatal(err)
	}
	if p, err = f.store.List(ctx, f.js, jobstore.ListFilter{}); err != nil || p.Matched != 0 {
		t.Fatalf("steps only: %+v %v", p, err)
	}

	// A record without headers, as Store.CreateJob wrote them before.
	old := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	legacy := jobstore.NewJob("legacy", spec.Job{Name: "legacy"}, old)
	if _, err := f.store.CreateJob(ctx, legacy); err != nil {
		t.Fatal(err)
	}
	// A deleted job.
	gone := jobstore.NewJob("gone", spec.Job{Name: "gone"}, old)
	if _, err := f.store.CreateJob(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if err := f.store.KV().Delete(ctx, protocol.JobKey("gone")); err != nil {
		t.Fatal(err)
	}
	// A finished job written with a retention TTL, as the scheduler's
	// terminal write does. The bucket must allow per-message TTLs.
	ttl := false
	if s, err := f.js.Stream(ctx, "KV_"+protocol.BucketJobs); err == nil {
		cfg := s.CachedInfo().Config
		cfg.AllowMsgTTL = true
		if _, err := f.js.UpdateStream(ctx, cfg); err == nil {
			ttl = true
		}
	}
	done := time.Now().UTC()
	m := nats.NewMsg("$KV." + protocol.BucketJobs + ".job.done")
	m.Data, _ = json.Marshal(&jobstore.Job{ID: "done", State: jobstore.JobSucceeded, CreatedAt: done})
	m.Header.Set(protocol.HeaderRecordState, string(jobstore.JobSucceeded))
	m.Header.Set(protocol.HeaderRecordCreated, done.Format(time.RFC3339Nano))
	if ttl {
		m.Header.Set("Nats-TTL", "168h")
	}
	if _, err := f.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}

	p, err = f.store.List(ctx, f.js, jobstore.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, j := range p.Jobs {
		ids = append(ids, j.ID)
	}
	if !slices.Equal(ids, []string{"done", "legacy"}) || p.Matched != 2 {
		t.Fatalf("listing: %v (matched %d)", ids, p.Matched)
	}
	if p.Jobs[1].State != jobstore.JobPending || !p.Jobs[1].Created.Equal(old) {
		t.Fatalf("legacy entry: %+v", p.Jobs[1].JobEntry)
	}
	if ttl {
		if exp := p.Jobs[0].ExpiresAt.Sub(p.Jobs[0].Updated); exp != 168*time.Hour {
			t.Fatalf("retention: expires %s after the terminal write, want 168h", exp)
		}
	} else {
		t.Log("the server refused per-message TTLs on the job bucket; retention not checked")
	}
}

// Jobs rewritten while a scan runs lose their old record (history 1)
// before the scan reaches it; their new record lies past the stream's last
// write at the start, where the scan stopped: `warden jobs ls` and the
// dashboard left out running jobs (2956-2997 of 3000 with 200 being
// updated). The scan reads on until it has caught up.
func TestScanSeesJobsRewrittenWhileItRuns(t *testing.T) {
	t.Parallel()
	f := newListFixture(t, 3000)
	ctx := testCtx(t)
	rewrite := func(id string) {
		created := f.base
		m := nats.NewMsg("$KV." + protocol.BucketJobs + "." + protocol.JobKey(id))
		m.Data = []byte(`{}`)
		m.Header.Set(protocol.HeaderRecordState, string(jobstore.JobRunning))
		m.Header.Set(protocol.HeaderRecordDesired, string(jobstore.JobSucceeded))
		m.Header.Set(protocol.HeaderRecordCreated, created.Format(time.RFC3339Nano))
		if _, err := f.js.PublishMsgAsync(m); err != nil {
			t.Error(err)
		}
	}
	for round := range 5 {
		done := make(chan struct{})
		go func() {
			defer close(done)
			for _, id := range f.ids[len(f.ids)-200:] { // the last the scan reaches
				rewrite(id)
			}
		}()
		got, err := f.store.ScanJobs(ctx, f.js)
		<-done
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, e := range got {
			seen[e.ID] = true
		}
		if len(seen) != len(f.ids) || len(got) != len(f.ids) {
			t.Fatalf("round %d: %d entries, %d jobs, want %d", round, len(got), len(seen), len(f.ids))
		}
		<-f.js.PublishAsyncComplete()
	}
}

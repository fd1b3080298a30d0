package jobstore

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nuid"
)

// The index's paging (order kept across writes, removed slots skipped and
// compacted, created bounds by binary search, counts kept up to date) is
// the scan's (pageOf over every entry), through thousands of random
// writes and removals: same page, Next, Matched, Counts and Scanned.
func TestIndexPagingIsTheScans(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	states := []JobState{JobPending, JobRunning, JobSucceeded, JobFailed, JobCancelled}
	entry := func(i int, rev uint64) JobEntry {
		// Few distinct creation times: many ties, ordered by id.
		created := base.Add(time.Duration(rng.IntN(500)) * time.Second)
		return JobEntry{ID: fmt.Sprintf("job-%05d", i), State: states[rng.IntN(len(states))], Desired: JobSucceeded,
			Created: created, Updated: created.Add(time.Minute), Revision: rev}
	}
	live := map[string]JobEntry{}
	var initial []JobEntry
	for i := range 3000 {
		e := entry(i, uint64(i+1))
		live[e.ID] = e
		initial = append(initial, e)
	}
	ix := &Index{cfg: IndexConfig{}.WithDefaults()}
	ix.install(initial, 3000)
	rev := uint64(3000)
	check := func(round int) {
		t.Helper()
		all := make([]JobEntry, 0, len(live))
		for _, e := range live {
			all = append(all, e)
		}
		filters := []ListFilter{
			{}, {Limit: 7}, {States: []JobState{JobRunning}, Limit: 40},
			{States: []JobState{JobFailed, JobCancelled, JobFailed}},
			{CreatedAfter: base.Add(100 * time.Second), Limit: 25},
			{CreatedBefore: base.Add(300 * time.Second), States: []JobState{JobPending}},
			{CreatedAfter: base.Add(200 * time.Second), CreatedBefore: base.Add(210 * time.Second), Limit: 3},
		}
		for fi, f := range filters {
			limit, after, _ := f.paging()
			for page := 0; page < 4; page++ {
				ix.mu.RLock()
				got, gotSel := ix.pageLocked(f, limit, after)
				ix.mu.RUnlock()
				want, wantSel := pageOf(all, f, limit, after)
				g, _ := json.Marshal([]any{got, gotSel})
				w, _ := json.Marshal([]any{want, wantSel})
				if !bytes.Equal(g, w) {
					t.Fatalf("round %d, filter %d, page %d:\nindex %.400s\nscan  %.400s", round, fi, page, g, w)
				}
				if want.Next == "" {
					break
				}
				c, _ := decodeCursor(want.Next)
				after = &c
			}
		}
	}
	check(0)
	next := 3000
	for round := 1; round <= 20; round++ {
		for range 300 {
			rev++
			switch op := rng.IntN(10); {
			case op < 3: // a new job
				e := entry(next, rev)
				next++
				live[e.ID] = e
				ix.put(e)
			case op < 7: // a job rewritten: its state, now and then its created time
				id := fmt.Sprintf("job-%05d", rng.IntN(next))
				e, ok := live[id]
				if !ok {
					continue
				}
				e.State, e.Revision = states[rng.IntN(len(states))], rev
				if rng.IntN(10) == 0 {
					e.Created = e.Created.Add(time.Second)
				}
				live[id] = e
				ix.put(e)
				ix.put(JobEntry{ID: id, State: JobFailed, Created: e.Created, Revision: rev - 1}) // older: ignored
			default: // removed
				id := fmt.Sprintf("job-%05d", rng.IntN(next))
				delete(live, id)
				ix.remove(id, rev)
			}
		}
		check(round)
	}
	if ix.removed > len(ix.order)/4+1024 {
		t.Fatalf("%d removed slots of %d: not compacted", ix.removed, len(ix.order))
	}
}

// TestIndexEntryCost measures what one job costs the index (the figure in
// Index's doc): its slot, id, map entry and place in order.
func TestIndexEntryCost(t *testing.T) {
	const n = 100_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	now := time.Now()
	entries := make([]JobEntry, n)
	for i := range entries {
		entries[i] = JobEntry{ID: "job-" + nuid.Next(), State: JobSucceeded, Desired: JobSucceeded,
			Created: now.Add(time.Duration(i) * time.Millisecond), Updated: now, ExpiresAt: now.Add(time.Hour), Revision: uint64(i + 1)}
	}
	ix := &Index{cfg: IndexConfig{}.WithDefaults()}
	ix.install(entries, n)
	entries = nil
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
	t.Logf("%.0f bytes per job (%d jobs: %.1f MB)", per, n, per*n/1e6)
	if len(ix.byID) != n || per > 400 {
		t.Fatalf("%d entries at %.0f bytes each; Index's doc says about 250", len(ix.byID), per)
	}
	runtime.KeepAlive(ix)
}

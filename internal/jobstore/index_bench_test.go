package jobstore_test

import (
	"testing"

	"github.com/wardenhq/warden/internal/jobstore"
)

// benchJobs is the store size of the listing benchmarks: the 20,000
// retained jobs the dashboard's listing was measured at (136 ms a call).
const benchJobs = 20_000

// benchListings lists the first page of every job, then of the running
// ones, as the dashboard and `?state=running` do.
func benchListings(b *testing.B, f listFixture, st *jobstore.Store) {
	for _, c := range []struct {
		name string
		lf   jobstore.ListFilter
	}{
		{"first_page", jobstore.ListFilter{}},
		{"running_first_page", jobstore.ListFilter{States: []jobstore.JobState{jobstore.JobRunning}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p, err := st.List(testCtx(b), f.js, c.lf)
				if err != nil {
					b.Fatal(err)
				}
				if len(p.Jobs) != jobstore.DefaultListLimit {
					b.Fatalf("%d jobs listed", len(p.Jobs))
				}
			}
		})
	}
}

// BenchmarkJobsListScan is Store.List as the CLI runs it: a headers-only
// scan of every job record, then the page's records.
func BenchmarkJobsListScan(b *testing.B) {
	f := newListFixture(b, benchJobs)
	benchListings(b, f, f.store)
}

// BenchmarkJobsListIndexed is Store.List answered by an Index, as the API
// process runs it: a stream info (and, when a job write is newer than the
// index, a message get), the page from memory, then the page's records.
func BenchmarkJobsListIndexed(b *testing.B) {
	f := newListFixture(b, benchJobs)
	ix := startIndex(b, f.js, jobstore.IndexConfig{})
	benchListings(b, f, ix.store)
	if s := ix.ix.Status(); s.Fallbacks != 0 {
		b.Fatalf("%d listings scanned", s.Fallbacks)
	}
}

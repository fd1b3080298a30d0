package ops_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// Jobs whose retention ends while they are listed are left out of the
// page, never fail it. The listing read a job's record, then its steps
// (steps done) in a second read: a job that expired between the two failed
// the whole page with "get job.<id>: not found" (21 of 503 listings, with
// a 1 s retention and constant writes). It reads both at once now. Here
// finished jobs with a 1 s retention are written while pages of them are
// listed.
func TestListingJobsThatExpireMeanwhile(t *testing.T) {
	t.Parallel()
	_, nc, js := natstest.Start(t, streams.Options{TaskShards: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	store, err := jobstore.Open(ctx, js, jobstore.WithRetention(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	o := ops.New(nc, store)
	sp := spec.Job{Name: "e", Steps: []spec.Step{{ID: "a", Action: "echo"}, {ID: "b", Action: "echo"}}}

	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	wg.Add(1)
	go func() { // finished jobs, as a scheduler ends them
		defer wg.Done()
		for i := 0; wctx.Err() == nil; i++ {
			now := time.Now().UTC()
			j := jobstore.NewJob(fmt.Sprintf("j%07d", i), sp, now)
			j.State, j.FinishedAt = jobstore.JobSucceeded, now
			steps, err := jobstore.NewSteps(j.ID, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
			if err != nil {
				t.Error(err)
				return
			}
			b := store.Batch()
			for _, st := range steps {
				st.State, st.FinishedAt = jobstore.StepSucceeded, now
				b.Add(store.EndedStepWrite(st, 0))
			}
			b.Add(store.JobWrite(j, 0))
			for _, r := range b.Wait(wctx) {
				if r.Err != nil && wctx.Err() == nil {
					t.Error(r.Err)
					return
				}
			}
		}
	}()

	// Listings of pages full of jobs about to expire, until enough of them
	// ran (before the fix, about one in ten failed here).
	const want = 60
	listings := 0
	natstest.Eventually(t, 50*time.Second, fmt.Sprintf("%d listings of expiring jobs", want), func() bool {
		p, err := o.ListJobs(ctx, jobstore.ListFilter{Limit: jobstore.MaxListLimit})
		if err != nil {
			t.Fatalf("listing %d: %v", listings, err)
		}
		if p.Matched > 0 {
			listings++
		}
		for _, j := range p.Jobs {
			if j.StepsTotal != 2 || j.StepsDone > 2 {
				t.Fatalf("job %s: %d of %d steps done, want at most 2 of 2", j.ID, j.StepsDone, j.StepsTotal)
			}
		}
		return listings >= want
	})
}

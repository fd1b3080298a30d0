package ops_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// The overview (the dashboard's first screen, refreshed on every change)
// scanned every retained job's header for its counts, even in the API
// process, whose listings come from its job index: it takes the counts
// of a listing now, from the index when it is current.
func TestOverviewCountsFromTheJobIndex(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	nc, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{TaskShards: 1})
	plain, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	states := []jobstore.JobState{jobstore.JobSucceeded, jobstore.JobRunning, jobstore.JobFailed, jobstore.JobSucceeded}
	for i := range 20 {
		id := fmt.Sprintf("job-%02d", i)
		j := jobstore.NewJob(id, spec.Job{Name: id, Steps: []spec.Step{{ID: "a", Action: "echo"}}}, time.Now().UTC())
		j.State = states[i%len(states)]
		if _, err := plain.CreateJob(context.Background(), j); err != nil {
			t.Fatal(err)
		}
	}
	want, err := ops.New(nc, plain).Overview(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	indexed, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	ix := jobstore.NewIndex(indexed, js, jobstore.IndexConfig{})
	indexed.UseIndex(ix)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ix.Run(ctx) }()
	defer func() { stop(); <-done }()
	natstest.Eventually(t, 10*time.Second, "the index built", func() bool { return ix.Status().Ready })

	before := ix.Status().Indexed
	got, err := ops.New(nc, indexed).Overview(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ix.Status().Indexed == before {
		t.Fatal("the overview scanned the job headers although the index was current")
	}
	if got.JobsTotal != 20 || got.JobsTotal != want.JobsTotal || fmt.Sprint(got.Jobs) != fmt.Sprint(want.Jobs) {
		t.Fatalf("overview from the index: %d %v; from a scan: %d %v", got.JobsTotal, got.Jobs, want.JobsTotal, want.Jobs)
	}
}

package dlq_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// A reopen whose write of the reopened step fails (not a lost
// compare-and-set) leaves the finished job as it was, and its ended steps'
// records keep the retention TTL. They were rewritten without it in the
// same batch as the failed write, and the job, still finished, was never
// touched again: those records outlived their job for ever. Here the
// failed step's record fits the server's max payload, and the same record
// reopened (its last error prefixed with "reopened by an operator after: ")
// does not.
func TestAFailedReopenKeepsTheRetentionOfTheEndedSteps(t *testing.T) {
	t.Parallel()
	const maxPayload = 64 << 10
	srv := natstest.NewLimited(t, maxPayload)
	_, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := jobstore.Open(ctx, js, jobstore.WithRetention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	const id = "job-big"
	now := time.Now().UTC()
	sp := spec.Job{Name: "r", Steps: []spec.Step{{ID: "a", Action: "echo"}, {ID: "b", Action: "echo"}}}
	job := jobstore.NewJob(id, sp, now)
	job.State, job.Error, job.FinishedAt = jobstore.JobFailed, "step b failed", now
	steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	steps[0].State, steps[0].FinishedAt = jobstore.StepSucceeded, now
	// Step b failed, its record holding only what the reopen keeps or
	// grows: it grows by 15 bytes (the last error's prefix, 31, and
	// "pending" for "failed" in the header and the body, less the TTL
	// header, 18), and is written 4 bytes under the max payload.
	fb := steps[1]
	fb.State, fb.Desired, fb.UpdatedAt, fb.LastError = jobstore.StepFailed, jobstore.StepSucceeded, now, "x"
	payload := func(m *nats.Msg) int { return m.Size() - len(m.Subject) - len(m.Reply) }
	fb.LastError = strings.Repeat("x", 1+maxPayload-4-payload(store.EndedStepWrite(fb, 0).Msg))
	if n := payload(store.EndedStepWrite(fb, 0).Msg); n != maxPayload-4 {
		t.Fatalf("step record of %d bytes, want %d", n, maxPayload-4)
	}
	if _, err := store.CreateJob(ctx, job); err != nil {
		t.Fatal(err)
	}
	for _, st := range steps { // as the scheduler writes them when the job ends
		b := store.Batch()
		b.Add(store.EndedStepWrite(st, 0))
		if r := b.Wait(ctx)[0]; r.Err != nil {
			t.Fatalf("write step %s: %v", st.ID, r.Err)
		}
	}
	before, err := store.Load(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !before.Expiring["a"] || !before.Expiring["b"] {
		t.Fatalf("ended steps' records carry the TTL: %v", before.Expiring)
	}

	err = dlq.Reopen(ctx, store, id, "b", now)
	if !errors.Is(err, nats.ErrMaxPayload) {
		t.Fatalf("reopen of a step whose record grows past the max payload: %v, want %v", err, nats.ErrMaxPayload)
	}
	after, err := store.Load(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if after.Job.State != jobstore.JobFailed || after.JobRev != before.JobRev {
		t.Fatalf("job %s at revision %d after the failed reopen, want failed at %d", after.Job.State, after.JobRev, before.JobRev)
	}
	for _, st := range after.Steps {
		if !after.Expiring[st.ID] || after.Revs[st.ID] != before.Revs[st.ID] {
			t.Errorf("step %s (%s): record at revision %d (was %d), TTL %v: want it untouched, with its retention",
				st.ID, st.State, after.Revs[st.ID], before.Revs[st.ID], after.Expiring[st.ID])
		}
	}
}

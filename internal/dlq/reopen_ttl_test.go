package dlq_test

import (
	"context"
	"errors"
	"slices"
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
	ctx, store := limitedStore(t, jobstore.WithRetention(time.Hour))
	const id = "job-big"
	now := time.Now().UTC()
	job, steps := failedJobOfTwo(t, id, "step b failed", now)
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

// A job retry that failed part-way leaves the job running with a step
// still failed; the retry tried again retries that step. It was refused
// ("only a finished job can be retried"), and the job failed again on the
// step the operator had asked to run.
func TestAJobRetryThatFailedPartWayCanBeRetried(t *testing.T) {
	t.Parallel()
	ctx, store := limitedStore(t)
	const id = "job-partial"
	now := time.Now().UTC()
	job, steps := failedJobOfTwo(t, id, "step a failed", now)
	sp := job.Spec
	for _, st := range steps {
		st.State, st.Desired, st.UpdatedAt, st.LastError = jobstore.StepFailed, jobstore.StepSucceeded, now, "x"
	}
	// b's record is one the reopen grows past the max payload (by the
	// last error's prefix): its write fails, a's lands.
	fb := steps[1]
	payload := func(m *nats.Msg) int { return m.Size() - len(m.Subject) - len(m.Reply) }
	fb.LastError = strings.Repeat("x", 1+maxPayload-4-payload(store.StepWrite(fb, 0).Msg))
	if _, err := store.CreateJob(ctx, job); err != nil {
		t.Fatal(err)
	}
	for _, st := range steps {
		if _, err := store.CreateStep(ctx, st); err != nil {
			t.Fatalf("write step %s: %v", st.ID, err)
		}
	}
	done, err := dlq.RetryJob(ctx, store, id, now)
	if !errors.Is(err, nats.ErrMaxPayload) || !slices.Equal(done, []string{"a"}) {
		t.Fatalf("first retry: reopened %v, %v; want a, then %v", done, err, nats.ErrMaxPayload)
	}
	snap, err := store.Load(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Job.State.Terminal() {
		t.Fatalf("job %s after a retry that reopened a step, want it running", snap.Job.State)
	}
	// Tried again, the retry takes b on (and fails on it again here: its
	// record cannot grow), rather than refusing the job as unfinished.
	done, err = dlq.RetryJob(ctx, store, id, now)
	if !errors.Is(err, nats.ErrMaxPayload) {
		t.Fatalf("second retry: reopened %v, %v; want b tried again (%v)", done, err, nats.ErrMaxPayload)
	}
	// A running job none of whose steps failed is still refused.
	ok := jobstore.NewJob("job-running", sp, now)
	ok.State = jobstore.JobRunning
	if _, err := store.CreateJob(ctx, ok); err != nil {
		t.Fatal(err)
	}
	okSteps, err := jobstore.NewSteps("job-running", sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range okSteps {
		if _, err := store.CreateStep(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := dlq.RetryJob(ctx, store, "job-running", now); !errors.Is(err, dlq.ErrWrongState) {
		t.Fatalf("retry of a running job with nothing failed: %v, want %v", err, dlq.ErrWrongState)
	}
}

// maxPayload is the server's max_payload in these tests: a record grown by
// a reopen can pass it.
const maxPayload = 64 << 10

// limitedStore is a job store on a server of maxPayload.
func limitedStore(t *testing.T, opts ...jobstore.Option) (context.Context, *jobstore.Store) {
	t.Helper()
	srv := natstest.NewLimited(t, maxPayload)
	_, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	store, err := jobstore.Open(ctx, js, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, store
}

// failedJobOfTwo is job id of steps a and b, failed with why, and its
// steps' records as created (to be ended by the caller).
func failedJobOfTwo(t *testing.T, id, why string, now time.Time) (*jobstore.Job, []*jobstore.Step) {
	t.Helper()
	sp := spec.Job{Name: "r", Steps: []spec.Step{{ID: "a", Action: "echo"}, {ID: "b", Action: "echo"}}}
	job := jobstore.NewJob(id, sp, now)
	job.State, job.Error, job.FinishedAt = jobstore.JobFailed, why, now
	steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	return job, steps
}

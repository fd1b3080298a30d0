package jobstore_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/spec"
)

// storeJob writes a job of n steps, each step record carrying output bytes
// of output, and returns the store.
func storeJob(t *testing.T, id string, n, output int) *jobstore.Store {
	t.Helper()
	st, _ := newStore(t)
	ctx := testCtx(t)
	sp := spec.Job{Name: "big"}
	for i := range n {
		sp.Steps = append(sp.Steps, spec.Step{ID: fmt.Sprintf("s%04d", i), Action: "echo"})
	}
	now := time.Now().UTC()
	j := jobstore.NewJob(id, sp, now)
	if _, err := st.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	out := json.RawMessage(`"` + strings.Repeat("x", output) + `"`)
	for start := 0; start < len(steps); start += 200 {
		b := st.Batch()
		for _, s := range steps[start:min(start+200, len(steps))] {
			if output > 0 {
				s.Output = out
			}
			b.Add(st.StepWrite(s, 0))
		}
		for _, r := range b.Wait(ctx) {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
	return st
}

// A job of more step records than one batched direct get returns (1,024:
// the server answers 413) could not be loaded at all: it worked while
// cached, and every reload failed. Compensation appends steps to a job of
// the default 1,000.
func TestLoadReadsMoreStepsThanOneBatchedGetReturns(t *testing.T) {
	t.Parallel()
	st := storeJob(t, "job-wide", 1100, 0)
	snap, err := st.Load(testCtx(t), "job-wide")
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Steps) != 1100 || snap.Steps[0].ID != "s0000" || snap.Steps[1099].ID != "s1099" || snap.Revs["s0500"] == 0 {
		t.Fatalf("loaded %d steps", len(snap.Steps))
	}
}

// nats-server ends a batched get's reply at its max_pending bytes (64 MiB
// by default) and says how many records are pending; the read took the
// reply as complete and returned part of the job, which the scheduler then
// took for a job whose other steps were never created. It goes on from
// where the reply stopped.
func TestLoadGoesOnWhereTheServerEndedAReply(t *testing.T) {
	t.Parallel()
	st := storeJob(t, "job-heavy", 80, 1000*1000)
	snap, err := st.Load(testCtx(t), "job-heavy")
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Steps) != 80 {
		t.Fatalf("loaded %d of 80 steps", len(snap.Steps))
	}
}

// A record removed (by hand here; by the retention's TTL, whose marker the
// server keeps an hour) leaves a marker as its key's last message. Creating
// the key again expected no message at all and failed with "exists" while
// every read said there was no record: the scheduler's "gone now, create
// it again" went round until the marker went. Both the single and the
// pipelined create now write over it.
func TestCreateOverARemovedRecord(t *testing.T) {
	t.Parallel()
	st, _ := newStore(t)
	ctx := testCtx(t)
	sp := spec.Job{Name: "again", Steps: []spec.Step{{ID: "a", Action: "echo"}}}
	for _, id := range []string{"job-one", "job-batch"} {
		if _, err := st.CreateJob(ctx, jobstore.NewJob(id, sp, time.Now().UTC())); err != nil {
			t.Fatal(err)
		}
		if err := st.KV().Delete(ctx, "job."+id); err != nil {
			t.Fatal(err)
		}
		if _, _, err := st.Job(ctx, id); !errors.Is(err, jobstore.ErrNotFound) {
			t.Fatalf("%s after delete: %v", id, err)
		}
	}
	if _, err := st.CreateJob(ctx, jobstore.NewJob("job-one", sp, time.Now().UTC())); err != nil {
		t.Fatalf("create over the marker: %v", err)
	}
	b := st.Batch()
	b.Add(st.JobWrite(jobstore.NewJob("job-batch", sp, time.Now().UTC()), 0))
	if r := b.Wait(ctx)[0]; r.Err != nil || r.Rev == 0 {
		t.Fatalf("pipelined create over the marker: %+v", r)
	}
	for _, id := range []string{"job-one", "job-batch"} {
		if j, _, err := st.Job(ctx, id); err != nil || j.ID != id {
			t.Fatalf("%s created again: %+v %v", id, j, err)
		}
	}
	// A create over a live record still fails.
	if _, err := st.CreateJob(ctx, jobstore.NewJob("job-one", sp, time.Now().UTC())); !errors.Is(err, jobstore.ErrExists) {
		t.Fatalf("create over a live record: %v", err)
	}
}

// Load says which step records carry the retention TTL (a job that ended,
// or is sealing its records before it ends), through both of its reads:
// the batched get, and the consumer for jobs of more than 1,024 steps.
func TestLoadSaysWhichStepRecordsExpire(t *testing.T) {
	t.Parallel()
	for _, n := range []int{3, 1100} {
		st := storeJob(t, "job-exp", n, 0)
		ctx := testCtx(t)
		snap, err := st.Load(ctx, "job-exp")
		if err != nil {
			t.Fatal(err)
		}
		sealed := snap.Steps[1]
		b := st.Batch()
		b.Add(st.EndedStepWrite(sealed, snap.Revs[sealed.ID]))
		for _, r := range b.Wait(ctx) {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
		snap, err = st.Load(ctx, "job-exp")
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Expiring) != 1 || !snap.Expiring[sealed.ID] {
			t.Fatalf("%d steps: expiring %v, want only %s", n, snap.Expiring, sealed.ID)
		}
	}
}

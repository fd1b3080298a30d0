package scheduler_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/handagent"
)

// A job open longer than the retention keeps its finished steps' records:
// the retention runs from the job's end, not from each step's. Before,
// a finished step's record expired while its job still ran; a scheduler
// that then read the job (after a restart) took the step for one never
// created and ran it again.
func TestRetentionRunsFromTheJobsEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := scheduler.Config{Retention: protocol.SignedDuration(5 * time.Second)}
	ctx, cancel := context.WithCancel(context.Background())
	nc1, _ := b.srv.Connect(t)
	first := runScheduler(ctx, t, nc1, cfg)
	def := handagent.Start(t, b.js, "default", "def-1", nil)

	b.submitNoReply(t, []byte(`{"name":"long","steps":[{"id":"a","action":"echo"},{"id":"b","action":"echo","pool":"gpu","depends_on":["a"]}]}`), "job-long")
	natstest.Eventually(t, 10*time.Second, "step a succeeded, b waits for a gpu agent", func() bool {
		st, _, err := b.store.Step(context.Background(), "job-long", "a")
		return err == nil && st.State == jobstore.StepSucceeded
	})
	// A job that finishes after step a: once its record has expired, so
	// would have step a's, had it been given the retention when it ended.
	b.submitNoReply(t, []byte(`{"name":"marker","steps":[{"id":"s","action":"echo"}]}`), "job-marker")
	b.waitJob(t, "job-marker", jobstore.JobSucceeded)
	natstest.Eventually(t, 20*time.Second, "the finished job's record expired", func() bool {
		_, _, err := b.store.Job(context.Background(), "job-marker")
		return err != nil
	})
	if _, _, err := b.store.Step(context.Background(), "job-long", "a"); err != nil {
		t.Errorf("step a's record, while its job is open: %v", err)
	}

	// A new scheduler reads the job afresh; the gpu agent lets it finish.
	cancel()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	b.startScheduler(t, cfg)
	handagent.Start(t, b.js, "gpu", "gpu-1", nil)
	b.waitJob(t, "job-long", jobstore.JobSucceeded)
	runs := 0
	for _, task := range def.Received() {
		if task.JobID == "job-long" && task.StepID == "a" {
			runs++
		}
	}
	if runs != 1 {
		t.Fatalf("step a ran %d times", runs)
	}
	// Once the job has ended, its steps' records expire with it.
	for _, step := range []string{"a", "b"} {
		if ttl := b.recordTTL(t, protocol.StepKey("job-long", step)); ttl != "5s" {
			t.Errorf("step %s of the finished job: Nats-TTL %q, want 5s", step, ttl)
		}
	}
}

// A job of more steps than one turn seals (writes again with the
// retention TTL) ends only once every step record carries the TTL.
func TestEndedJobsStepRecordsAllCarryTheRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	handagent.Start(t, b.js, "default", "seal-1", nil)
	var sb strings.Builder
	sb.WriteString(`{"name":"wide","steps":[`)
	const n = 150 // more than two slices of 64
	for i := range n {
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, `{"id":"s%03d","action":"echo"}`, i)
	}
	sb.WriteString("]}")
	b.submitNoReply(t, []byte(sb.String()), "job-wide")
	b.waitJob(t, "job-wide", jobstore.JobSucceeded)
	for i := range n {
		if ttl := b.recordTTL(t, protocol.StepKey("job-wide", fmt.Sprintf("s%03d", i))); ttl != jobstore.DefaultRetention.String() {
			t.Fatalf("step s%03d of the ended job: Nats-TTL %q, want %s", i, ttl, jobstore.DefaultRetention)
		}
	}
}

// recordTTL returns the Nats-TTL header of the job-store record key holds
// ("" without one), read as stored.
func (b *bundle) recordTTL(t *testing.T, key string) string {
	t.Helper()
	m, err := b.nc.Request("$JS.API.DIRECT.GET.KV_"+protocol.BucketJobs+".$KV."+protocol.BucketJobs+"."+key, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return m.Header.Get("Nats-TTL")
}

package ops_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// jobStoreSeq is the job store stream's last sequence: every record write
// adds one.
func jobStoreSeq(t *testing.T, ctx context.Context, js jetstream.JetStream) uint64 {
	t.Helper()
	s, err := js.Stream(ctx, "KV_"+protocol.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// A job retry reopened its failed steps one at a time, and each reopen
// read every step and wrote every ended one again, one synchronous write
// after another, those already written included: a job of 200 steps with
// 50 failed cost ~10,000 writes (and one of 1,000 with 100 failed ~100,000,
// past the CLI's 10 s). It is one pass now: each record written at most
// once (the reopened steps, the skipped ones, the ended ones whose records
// carry the retention TTL, then the job). A scheduler and an agent then
// run what was reopened.
func TestRetryJobReopensManyStepsInOnePass(t *testing.T) {
	t.Parallel()
	srv, nc, js := natstest.Start(t, streams.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	// 200 steps: 50 failed, 10 skipped after a failed one, 140 succeeded,
	// their records sealed with the TTL as the scheduler leaves a job that
	// ended.
	const (
		nSteps, nFailed, nSkipped = 200, 50, 10
		id                        = "job-wide"
	)
	sp := spec.Job{Name: "wide"}
	for i := range nSteps {
		s := spec.Step{ID: fmt.Sprintf("s%03d", i), Action: "echo"}
		if i >= nFailed && i < nFailed+nSkipped {
			s.DependsOn = []string{fmt.Sprintf("s%03d", i-nFailed)}
		}
		sp.Steps = append(sp.Steps, s)
	}
	now := time.Now().UTC()
	job := jobstore.NewJob(id, sp, now)
	job.State, job.Error, job.FinishedAt = jobstore.JobFailed, "step s000 failed", now
	steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	b := store.Batch()
	for i, st := range steps {
		st.Epoch, st.Attempt = 1, 1
		switch {
		case i < nFailed:
			st.Fail("boom", now)
		case i < nFailed+nSkipped:
			st.State, st.FinishedAt, st.LastError = jobstore.StepSkipped, now, "dependency failed"
		default:
			st.State, st.FinishedAt = jobstore.StepSucceeded, now
		}
		b.Add(store.EndedStepWrite(st, 0))
	}
	for _, r := range b.Wait(ctx) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if _, err := store.CreateJob(ctx, job); err != nil {
		t.Fatal(err)
	}

	o := ops.New(nc, store)
	before := jobStoreSeq(t, ctx, js)
	start := time.Now()
	reopened, err := o.RetryJob(ctx, id)
	took := time.Since(start)
	if err != nil || len(reopened) != nFailed {
		t.Fatalf("retry: %d steps reopened (%v), want %d", len(reopened), err, nFailed)
	}
	writes := jobStoreSeq(t, ctx, js) - before
	t.Logf("job retry of %d steps (%d failed): %d job-store writes in %s", nSteps, nFailed, writes, took.Round(time.Millisecond))
	if writes > nSteps+nFailed {
		t.Fatalf("job retry wrote the job store %d times; at most %d expected (each record once)", writes, nSteps+nFailed)
	}
	snap, err := store.Load(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Job.State != jobstore.JobRunning || len(snap.Expiring) != 0 {
		t.Fatalf("after the retry: job %s, %d step records still carrying the TTL", snap.Job.State, len(snap.Expiring))
	}
	for i, st := range snap.Steps {
		if want := i < nFailed+nSkipped; want != (st.State == jobstore.StepPending) {
			t.Fatalf("step %s is %s after the retry", st.ID, st.State)
		}
	}

	// A scheduler and an agent run what was reopened.
	snc, _ := srv.Connect(t)
	sched, err := scheduler.New(scheduler.Config{}, snc, scheduler.WithLogger(zerolog.Nop()))
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sched.Run(sctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("scheduler: %v", err)
		}
	}()
	agenttest.StartAgent(t, nc, agent.Config{ID: "a1", Pool: "default", MaxConcurrent: 64})
	// The retry's own request to advance the job found no scheduler; ask
	// again until one answers (the supervisor would, after its grace).
	natstest.Eventually(t, 30*time.Second, "a scheduler advanced the reopened job", func() bool {
		dlq.Kick(ctx, nc, id)
		st, _, err := store.Step(ctx, id, "s000")
		return err == nil && st.State != jobstore.StepPending
	})
	final, err := o.WaitJob(ctx, id, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if final.State != jobstore.JobSucceeded {
		t.Fatalf("retried job ended %s, want succeeded", final.State)
	}
	snap, err = store.Load(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range snap.Steps[:nFailed+nSkipped] {
		if st.State != jobstore.StepSucceeded || st.Epoch < 2 {
			t.Fatalf("step %s: %s epoch %d after the retried job ended: it did not run again", st.ID, st.State, st.Epoch)
		}
	}
}

// A job retry whose write of one step fails (here: step b's record would
// exceed the maximum payload once its last error is longer) reopens the
// others and the job all the same, asks a scheduler to run them, and says
// which it reopened (docs/api.md, "Errors").
func TestRetryJobThatFailsPartWayReopensTheJob(t *testing.T) {
	t.Parallel()
	_, nc, js := natstest.Start(t, streams.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	const id = "job-partial"
	now := time.Now().UTC()
	sp := spec.Job{Name: "partial", Steps: []spec.Step{{ID: "a", Action: "echo"}, {ID: "b", Action: "echo"}}}
	steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range steps {
		st.State, st.Epoch, st.Attempt, st.LastError = jobstore.StepFailed, 1, 1, "exit status 1"
	}
	big := steps[1]
	size := func() int {
		m := store.StepWrite(big, 0).Msg
		return m.Size() - len(m.Subject)
	}
	big.Params = json.RawMessage(`""`)
	big.Params = json.RawMessage(`"` + strings.Repeat("x", int(nc.MaxPayload())-8-size()) + `"`)
	for _, st := range steps {
		if _, err := store.CreateStep(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	j := jobstore.NewJob(id, sp, now)
	j.State, j.Error, j.FinishedAt = jobstore.JobFailed, "step a failed", now
	if _, err := store.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	kicks := make(chan string, 8)
	sub, err := nc.Subscribe(protocol.SubjectControlAdvance, func(m *nats.Msg) {
		kicks <- string(m.Data)
		_ = m.Respond(protocol.OKReply(""))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	_, err = ops.New(nc, store).RetryJob(ctx, id)
	var pe *ops.PartialRetryError
	if !errors.As(err, &pe) || !slices.Equal(pe.Reopened, []string{"a"}) {
		t.Fatalf("retry: %v, want a partial retry that reopened a", err)
	}
	if st, _, err := store.Step(ctx, id, "a"); err != nil || st.State != jobstore.StepPending {
		t.Fatalf("step a: %v %v, want pending", st, err)
	}
	if st, _, err := store.Step(ctx, id, "b"); err != nil || st.State != jobstore.StepFailed {
		t.Fatalf("step b: %v, want failed", err)
	}
	if job, _, err := store.Job(ctx, id); err != nil || job.State != jobstore.JobRunning {
		t.Fatalf("job: %v %v, want running", job, err)
	}
	select {
	case got := <-kicks:
		if got != id {
			t.Fatalf("advance asked for %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no scheduler was asked to advance the job")
	}
}

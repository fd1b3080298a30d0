package dlq_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

type bundle struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	store *jobstore.Store
	q     *dlq.Queue
}

func setup(t *testing.T) *bundle {
	t.Helper()
	_, nc, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	q, err := dlq.Open(ctx, nc, js)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{nc: nc, js: js, store: store, q: q}
}

// letter stores a dead letter as the supervisor does; job and step empty
// make a letter whose task could not be decoded.
func (b *bundle) letter(t *testing.T, job, step string, reason protocol.DLQReason, body string) uint64 {
	t.Helper()
	m := nats.NewMsg(protocol.DLQSubject("default", "a1"))
	m.Data = []byte(body)
	if job != "" {
		m.Header.Set(protocol.HeaderJob, job)
		m.Header.Set(protocol.HeaderStep, step)
		m.Header.Set(protocol.HeaderEpoch, "1")
	}
	m.Header.Set(protocol.HeaderDLQReason, string(reason))
	m.Header.Set(protocol.HeaderDLQDetail, "test")
	ack, err := b.js.PublishMsg(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// deadLettered stores a job whose only step was dead-lettered.
func (b *bundle) deadLettered(t *testing.T, id string) {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC()
	sp := spec.Job{Name: "p", Steps: []spec.Step{{ID: "s", Action: "echo"}}}
	job := jobstore.NewJob(id, sp, now)
	job.State, job.Error, job.FinishedAt = jobstore.JobFailed, "step s dead_lettered", now
	steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	steps[0].Epoch, steps[0].Attempt = 1, 1
	steps[0].DeadLetter("delivered 5 times", now)
	if _, err := b.store.CreateJob(ctx, job); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.CreateStep(ctx, steps[0]); err != nil {
		t.Fatal(err)
	}
}

// Issue 15: `warden dlq retry` of an undecodable letter exited 4 as if NATS
// were down. It is a typed error now, a usage error for the CLI (exit 2),
// and the letter stays for `dlq purge`.
func TestRetryOfAnUndecodableLetterIsATypedError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.letter(t, "", "", protocol.DLQUndecodable, "\x00not a task")
	_, err := b.q.Retry(context.Background(), b.store, id)
	var nre *dlq.NotRetriableError
	if !errors.As(err, &nre) || nre.ID != id || nre.Reason != string(protocol.DLQUndecodable) {
		t.Fatalf("retry: %v (%T)", err, err)
	}
	if !errors.Is(err, dlq.ErrNotRetriable) || !errors.Is(err, dlq.ErrWrongState) || errors.Is(err, dlq.ErrNotFound) {
		t.Fatalf("retry error does not match its sentinels: %v", err)
	}
	code := ops.CodeOf(err)
	t.Logf("retry of letter %d: %v (code %s, exit %d)", id, err, code, code.ExitCode())
	if code.ExitCode() != ops.ExitUsage {
		t.Fatalf("exit %d, want %d", code.ExitCode(), ops.ExitUsage)
	}
	if left, _ := b.q.List(context.Background(), 0); len(left) != 1 || string(left[0].Payload) != `"\u0000not a task"` {
		t.Fatalf("letter not kept as it was: %+v", left)
	}
}

func TestRetryReopensTheStepAsksForAnAdvanceAndDeletesTheLetter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.deadLettered(t, "job-r")
	id := b.letter(t, "job-r", "s", protocol.DLQMaxDeliveries, `{"job_id":"job-r","step_id":"s"}`)
	kicked := make(chan string, 1)
	sub, err := b.nc.Subscribe(protocol.SubjectControlAdvance, func(m *nats.Msg) {
		kicked <- string(m.Data)
		_ = m.Respond(protocol.OKReply(""))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	l, err := b.q.Retry(ctx, b.store, id)
	if err != nil || l.JobID != "job-r" || l.StepID != "s" || l.Reason != string(protocol.DLQMaxDeliveries) {
		t.Fatalf("retry: %+v %v", l, err)
	}
	select {
	case job := <-kicked:
		if job != "job-r" {
			t.Fatalf("advance asked for %q", job)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no advance request")
	}
	st, _, err := b.store.Step(ctx, "job-r", "s")
	if err != nil || st.State != jobstore.StepPending || st.Attempt != 0 || st.Recoveries != 0 {
		t.Fatalf("step after retry: %+v %v", st, err)
	}
	job, _, err := b.store.Job(ctx, "job-r")
	if err != nil || job.State != jobstore.JobRunning || job.Desired != jobstore.JobSucceeded {
		t.Fatalf("job after retry: %+v %v", job, err)
	}
	if _, err := b.q.Get(ctx, id); !errors.Is(err, dlq.ErrNotFound) {
		t.Fatalf("letter still there: %v", err)
	}
	if _, err := b.q.Retry(ctx, b.store, id); !errors.Is(err, dlq.ErrNotFound) {
		t.Fatalf("second retry: %v", err)
	}
}

// A letter whose step was retried some other way (warden job retry) is
// not retried twice: the step is no longer dead-lettered.
func TestRetryOfAStepNoLongerDeadLetteredIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.deadLettered(t, "job-w")
	if err := dlq.Reopen(ctx, b.store, "job-w", "s", time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	id := b.letter(t, "job-w", "s", protocol.DLQPoison, `{}`)
	if _, err := b.q.Retry(ctx, b.store, id); !errors.Is(err, dlq.ErrWrongState) || errors.Is(err, dlq.ErrNotRetriable) {
		t.Fatalf("retry of a pending step: %v", err)
	}
	if _, err := b.q.Get(ctx, id); err != nil {
		t.Fatalf("letter gone after a refused retry: %v", err)
	}
}

// A letter outlives its step's dead letter: warden job retry reopens the
// step without deleting it, and the step may then fail again or be
// cancelled with its job. Retrying such a letter reopened the step and
// brought the job back to running; only a step still dead-lettered is.
func TestRetryOfALetterWhoseStepEndedOtherwiseIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.deadLettered(t, "job-c")
	st, rev, err := b.store.Step(ctx, "job-c", "s")
	if err != nil {
		t.Fatal(err)
	}
	st.State, st.Desired = jobstore.StepCancelled, jobstore.StepCancelled
	if _, err := b.store.UpdateStep(ctx, st, rev); err != nil {
		t.Fatal(err)
	}
	id := b.letter(t, "job-c", "s", protocol.DLQPoison, `{}`)
	if _, err := b.q.Retry(ctx, b.store, id); !errors.Is(err, dlq.ErrWrongState) {
		t.Fatalf("retry of a cancelled step's letter: %v", err)
	}
	if st, _, err := b.store.Step(ctx, "job-c", "s"); err != nil || st.State != jobstore.StepCancelled {
		t.Fatalf("step after a refused retry: %+v %v", st, err)
	}
	if job, _, err := b.store.Job(ctx, "job-c"); err != nil || job.State != jobstore.JobFailed {
		t.Fatalf("job after a refused retry: %+v %v", job, err)
	}
}

// A compensated job's completed steps were undone, and compensation is
// planned once per job: reopening its failed step ended the job succeeded
// with its work undone (or, compensation_failed, ran forward and undo work
// side by side). Job retry and dlq retry refuse it.
func TestReopenOfACompensatedJobIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	o := ops.New(b.nc, b.store)
	for _, state := range []jobstore.JobState{jobstore.JobCompensated, jobstore.JobCompensationFailed} {
		id := "job-" + strings.ReplaceAll(string(state), "_", "-")
		b.deadLettered(t, id)
		job, rev, err := b.store.Job(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		job.State = state
		if _, err := b.store.UpdateJob(ctx, job, rev); err != nil {
			t.Fatal(err)
		}
		if steps, err := o.RetryJob(ctx, id); !errors.Is(err, dlq.ErrWrongState) {
			t.Fatalf("job retry of a %s job: reopened %v, %v", state, steps, err)
		}
		letter := b.letter(t, id, "s", protocol.DLQPoison, `{}`)
		if _, err := b.q.Retry(ctx, b.store, letter); !errors.Is(err, dlq.ErrWrongState) {
			t.Fatalf("dlq retry of a %s job's letter: %v", state, err)
		}
		if st, _, err := b.store.Step(ctx, id, "s"); err != nil || st.State != jobstore.StepDeadLettered {
			t.Fatalf("%s job's step after refused retries: %+v %v", state, st, err)
		}
	}
}

// A finished job's step records carry the retention TTL from the job's
// end, while the job may run again: reopened (dlq retry, job retry) near
// the end of its retention, the job lost its succeeded steps' records
// mid-run. Reopening writes them again without it, until the job's next
// end. Retention 3 s here; a job stored beside it, not reopened, shows
// when the old TTL ends.
func TestReopenRenewsTheRetentionOfTheJobsEndedSteps(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	store, err := jobstore.Open(ctx, js, jobstore.WithRetention(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	sp := spec.Job{Name: "r", Steps: []spec.Step{{ID: "a", Action: "echo"}, {ID: "b", Action: "echo", DependsOn: []string{"a"}}}}
	start := time.Now()
	for _, id := range []string{"job-reopened", "job-beside"} {
		now := time.Now().UTC()
		job := jobstore.NewJob(id, sp, now)
		job.State, job.FinishedAt = jobstore.JobFailed, now
		steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
		if err != nil {
			t.Fatal(err)
		}
		steps[0].State, steps[0].FinishedAt = jobstore.StepSucceeded, now
		steps[1].Fail("boom", now)
		if _, err := store.CreateJob(ctx, job); err != nil {
			t.Fatal(err)
		}
		b := store.Batch() // as the scheduler writes them when the job ends
		for _, st := range steps {
			b.Add(store.EndedStepWrite(st, 0))
		}
		for _, r := range b.Wait(ctx) {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
	natstest.Eventually(t, 10*time.Second, "half the retention passed", func() bool { return time.Since(start) > 1500*time.Millisecond })
	if err := dlq.Reopen(ctx, store, "job-reopened", "b", time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 20*time.Second, "the job beside lost its step record", func() bool {
		_, _, err := store.Step(ctx, "job-beside", "a")
		return errors.Is(err, jobstore.ErrNotFound)
	})
	if st, _, err := store.Step(ctx, "job-reopened", "a"); err != nil || st.State != jobstore.StepSucceeded {
		t.Fatalf("the reopened job's succeeded step: %+v %v", st, err)
	}
}

func TestListGetAndPurge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var ids []uint64
	for _, r := range []protocol.DLQReason{protocol.DLQMaxDeliveries, protocol.DLQPoison, protocol.DLQExpired} {
		ids = append(ids, b.letter(t, "job-l", "s", r, `{"k":1}`))
	}
	all, err := b.q.List(ctx, 0)
	if err != nil || len(all) != 3 || all[0].ID != ids[0] || all[2].Reason != string(protocol.DLQExpired) {
		t.Fatalf("list: %+v %v", all, err)
	}
	if two, _ := b.q.List(ctx, 2); len(two) != 2 || two[1].ID != ids[1] {
		t.Fatalf("list 2: %+v", two)
	}
	l, err := b.q.Get(ctx, ids[1])
	if err != nil || l.Reason != string(protocol.DLQPoison) || l.Detail != "test" || string(l.Payload) != `{"k":1}` || l.Epoch != "1" {
		t.Fatalf("get: %+v %v", l, err)
	}
	if _, err := b.q.Get(ctx, 999); !errors.Is(err, dlq.ErrNotFound) {
		t.Fatalf("get of a missing letter: %v", err)
	}
	n, err := b.q.Purge(ctx)
	if err != nil || n != 3 {
		t.Fatalf("purge: %d %v", n, err)
	}
	if left, _ := b.q.List(ctx, 0); len(left) != 0 {
		t.Fatalf("%d letters after purge", len(left))
	}
}

func TestParseID(t *testing.T) {
	t.Parallel()
	if id, err := dlq.ParseID("42"); err != nil || id != 42 {
		t.Fatalf("42: %d %v", id, err)
	}
	for _, s := range []string{"0", "-1", "x", ""} {
		if _, err := dlq.ParseID(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
}

// A step reopened while its job is finishing (every step ended, the
// scheduler writing the steps' records and then the job's) writes the job
// record too: the scheduler's terminal write then loses its
// compare-and-set and reads the reopened step. Before, the job record of
// an open job was left alone, and the job could end over the step.
func TestReopenWritesTheRecordOfAFinishingJob(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	sp := spec.Job{Name: "f", Steps: []spec.Step{{ID: "a", Action: "echo"}, {ID: "b", Action: "echo"}}}
	now := time.Now().UTC()
	job := jobstore.NewJob("job-finishing", sp, now)
	job.State = jobstore.JobRunning
	rev, err := store.CreateJob(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	steps, err := jobstore.NewSteps(job.ID, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	steps[0].State, steps[0].FinishedAt = jobstore.StepSucceeded, now
	steps[1].Fail("boom", now)
	for _, st := range steps {
		if _, err := store.CreateStep(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	if err := dlq.Reopen(ctx, store, job.ID, "b", now); err != nil {
		t.Fatal(err)
	}
	j, after, err := store.Job(ctx, job.ID)
	if err != nil || after == rev || j.State != jobstore.JobRunning {
		t.Fatalf("job record after a reopen while finishing: rev %d (was %d), state %v, %v", after, rev, j.State, err)
	}
}

// A job whose steps live in its record (one step: Inline) is reopened by
// one write of that record: the step pending, the job running.
func TestRetryJobOfAnInlineJobIsOneWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := time.Now().UTC()
	sp := spec.Job{Name: "i", Steps: []spec.Step{{ID: "s", Action: "echo"}}}
	job := jobstore.NewJob("job-inline", sp, now)
	steps, err := jobstore.NewSteps(job.ID, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	steps[0].Epoch, steps[0].Attempt = 1, 1
	steps[0].DeadLetter("delivered 5 times", now)
	job.Inline, job.Steps = true, steps
	job.State, job.Error, job.FinishedAt = jobstore.JobFailed, "step s dead_lettered", now
	rev, err := b.store.CreateJob(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	reopened, err := dlq.RetryJob(ctx, b.store, job.ID, now)
	if err != nil || len(reopened) != 1 || reopened[0] != "s" {
		t.Fatalf("retry: %v %v", reopened, err)
	}
	j, after, err := b.store.Job(ctx, job.ID)
	if err != nil || after != rev+1 || j.State != jobstore.JobRunning || j.Steps[0].State != jobstore.StepPending || j.Steps[0].Attempt != 0 {
		t.Fatalf("after the retry: revision %d (was %d), job %s, step %+v, %v", after, rev, j.State, j.Steps[0], err)
	}
}

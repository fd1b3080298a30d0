package dlq_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// A job retry reset a step's attempts but kept its expiry: a step with a
// ttl that failed for good and was retried once the ttl had passed
// expired at its first dispatch without running (the job ended expired,
// the agent ran once), and so did the step skipped in its wake. The
// expiry runs again from the retry now: both steps run and the job
// succeeds.
func TestJobRetryAfterTheTTLRunsTheStepAgain(t *testing.T) {
	t.Parallel()
	_, b := live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	var runs atomic.Int32 // of step s
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "a1", Pool: "default", MaxConcurrent: 4})
	a.Script(func(ctx context.Context, task *agent.Task) (any, error) {
		if task.StepID == "s" && runs.Add(1) == 1 {
			return nil, agent.Permanent(errors.New("bad input"))
		}
		return map[string]string{"step": task.StepID}, nil
	})
	const id = "job-ttl-retry"
	m := nats.NewMsg(protocol.SubjectSubmit)
	m.Data = []byte("name: t\nsteps: [{id: s, action: echo, ttl: 4s}, {id: next, action: echo, depends_on: [s], ttl: 4s}]")
	m.Header.Set(protocol.HeaderJobID, id)
	if _, err := b.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 30*time.Second, "job created", func() bool {
		_, _, err := b.store.Job(ctx, id)
		return err == nil
	})
	o := ops.New(b.nc, b.store)
	if j, err := o.WaitJob(ctx, id, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	} else if j.State != jobstore.JobFailed || runs.Load() != 1 {
		t.Fatalf("job ended %s (%s), s ran %d times: want failed, once", j.State, j.Error, runs.Load())
	}
	snap, err := b.store.Load(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var last time.Time
	for _, st := range snap.Steps {
		if st.ExpiresAt.IsZero() {
			t.Fatalf("step %s has no expiry: %+v", st.ID, st)
		}
		if st.ExpiresAt.After(last) {
			last = st.ExpiresAt
		}
	}
	natstest.Eventually(t, 30*time.Second, "the steps' ttl passed", func() bool { return time.Now().After(last) })

	reopened, err := o.RetryJob(ctx, id)
	if err != nil || len(reopened) != 1 || reopened[0] != "s" {
		t.Fatalf("job retry: %v %v", reopened, err)
	}
	j, err := o.WaitJob(ctx, id, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != jobstore.JobSucceeded || runs.Load() != 2 {
		t.Fatalf("retried job ended %s (%s), s ran %d times: want succeeded, twice", j.State, j.Error, runs.Load())
	}
}

// A job that ended expired is retried (expired was not among the states a
// retry reopens), and each reopened step's expiry is the one its spec
// gives, taken from the retry: a ttl runs again from it, an absolute
// expires_at still ahead is kept and one already past is dropped, the
// scheduler's default_task_expiry (no expiry in the spec) runs its
// window again; the step skipped in their wake is renewed the same way.
// Then the job runs and succeeds.
func TestJobRetryOfAnExpiredJobRenewsEachStepsExpiry(t *testing.T) {
	t.Parallel()
	_, b := live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "a1", Pool: "default", MaxConcurrent: 4})
	a.Script(func(ctx context.Context, task *agent.Task) (any, error) {
		return map[string]string{"step": task.StepID}, nil
	})

	o := ops.New(b.nc, b.store)
	// A job run first: the scheduler is up when the retry asks it to
	// advance the job (else the job waits for its periodic scan).
	m := nats.NewMsg(protocol.SubjectSubmit)
	m.Data = []byte("name: w\nsteps: [{id: s, action: echo}]")
	m.Header.Set(protocol.HeaderJobID, "job-warm-up")
	if _, err := b.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 30*time.Second, "warm-up job succeeded", func() bool {
		j, _, err := b.store.Job(ctx, "job-warm-up")
		return err == nil && j.State == jobstore.JobSucceeded
	})

	now := time.Now().UTC()
	created := now.Add(-time.Hour)
	past, ahead := now.Add(-30*time.Minute), now.Add(time.Hour)
	const defaultExpiry = 10 * time.Minute
	sp := spec.Job{Name: "x", Steps: []spec.Step{
		{ID: "ttl", Action: "echo", TTL: protocol.Duration(time.Minute)},
		{ID: "past", Action: "echo", ExpiresAt: &past},
		{ID: "dflt", Action: "echo"},
		{ID: "ahead", Action: "echo", ExpiresAt: &ahead, DependsOn: []string{"ttl"}},
	}}
	const id = "job-expired-retry"
	job := jobstore.NewJob(id, sp, created)
	steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute, Expiry: defaultExpiry}, created)
	if err != nil {
		t.Fatal(err)
	}
	ended := created.Add(2 * time.Minute)
	for _, st := range steps[:3] {
		st.Expire(ended)
	}
	steps[3].State, steps[3].FinishedAt, steps[3].LastError = jobstore.StepSkipped, ended, "a dependency expired"
	job.State, job.Error, job.FinishedAt = jobstore.JobExpired, "step ttl "+steps[0].LastError, ended
	if _, err := b.store.CreateJob(ctx, job); err != nil {
		t.Fatal(err)
	}
	for _, st := range steps {
		if _, err := b.store.CreateStep(ctx, st); err != nil {
			t.Fatal(err)
		}
	}

	before := time.Now().UTC()
	reopened, err := o.RetryJob(ctx, id)
	after := time.Now().UTC()
	if err != nil || len(reopened) != 3 {
		t.Fatalf("job retry of an expired job: %v %v", reopened, err)
	}
	within := func(got time.Time, d time.Duration) bool {
		return !got.Before(before.Add(d)) && !got.After(after.Add(d))
	}
	for _, st := range steps {
		got, _, err := b.store.Step(ctx, id, st.ID)
		if err != nil {
			t.Fatal(err)
		}
		var ok bool
		switch st.ID {
		case "ttl":
			ok = within(got.ExpiresAt, time.Minute)
		case "past":
			ok = got.ExpiresAt.IsZero()
		case "dflt":
			ok = within(got.ExpiresAt, defaultExpiry)
		case "ahead":
			ok = got.ExpiresAt.Equal(ahead)
		}
		if !ok {
			t.Errorf("step %s reopened with expires_at %v (retried between %v and %v)", st.ID, got.ExpiresAt, before, after)
		}
	}
	if j, err := o.WaitJob(ctx, id, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	} else if j.State != jobstore.JobSucceeded {
		t.Fatalf("retried job ended %s (%s), want succeeded", j.State, j.Error)
	}
}

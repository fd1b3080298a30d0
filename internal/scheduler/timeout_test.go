package scheduler_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
)

// timeoutAgent starts agent a1 whose "slow" steps run until they are
// stopped, and returns what it ran and which runs were stopped.
func timeoutAgent(t *testing.T, b *bundle) (ran, stopped func() string) {
	t.Helper()
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "a1", Pool: "default"})
	var mu sync.Mutex
	var order, stops []string
	a.Script(func(ctx context.Context, task *agent.Task) (any, error) {
		mu.Lock()
		order = append(order, task.StepID)
		mu.Unlock()
		if task.StepID != "slow" {
			return "ok", nil
		}
		select {
		case <-ctx.Done():
			mu.Lock()
			stops = append(stops, task.StepID)
			mu.Unlock()
			return nil, ctx.Err()
		case <-time.After(time.Minute):
			return "ok", nil
		}
	})
	join := func(s *[]string) func() string {
		return func() string {
			mu.Lock()
			defer mu.Unlock()
			return strings.Join(*s, " ")
		}
	}
	return join(&order), join(&stops)
}

// A job's timeout bounds the whole job (Temporal's execution timeout):
// past it, the running step is stopped on its agent, the pending one is
// cancelled unrun, and the job fails "timed out", whatever the steps'
// own timeouts (a minute here).
func TestJobTimeoutStopsItsStepsAndFailsIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	ran, stopped := timeoutAgent(t, b)
	start := time.Now()
	publishJobs(t, b, 1, "bounded", `{"name":"bounded","timeout":"1s","steps":[
 {"id":"slow","action":"echo","timeout":"1m"},
 {"id":"after","action":"echo","depends_on":["slow"]}]}`)
	job := b.waitJobWithin(t, "bounded-0000", jobstore.JobFailed, 20*time.Second)
	if !strings.HasPrefix(job.Error, "timed out: not finished within its timeout of 1s") || !job.TimedOut {
		t.Fatalf("job error %q (timed_out %v); want the timeout", job.Error, job.TimedOut)
	}
	for id, want := range map[string]jobstore.StepState{"slow": jobstore.StepCancelled, "after": jobstore.StepCancelled} {
		st, _, err := b.store.Step(context.Background(), job.ID, id)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != want {
			t.Errorf("step %s %s (%s), want %s", id, st.State, st.LastError, want)
		}
	}
	if got := ran(); got != "slow" {
		t.Errorf("ran %q, want slow alone", got)
	}
	if got := stopped(); got != "slow" {
		t.Errorf("stopped %q, want slow", got)
	}
	t.Logf("job %s %s after submission: %s", job.State, time.Since(start).Round(time.Millisecond), job.Error)
}

// A job that times out after a step with a compensation succeeded undoes
// it, as after any failure: the timeout is why it did not complete.
func TestJobTimeoutCompensates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	ran, _ := timeoutAgent(t, b)
	publishJobs(t, b, 1, "trip", `{"name":"trip","timeout":"1s","steps":[
 {"id":"seat","action":"echo","compensate":{"action":"echo"}},
 {"id":"slow","action":"echo","depends_on":["seat"]}]}`)
	job := b.waitJobWithin(t, "trip-0000", jobstore.JobCompensated, 20*time.Second)
	if !strings.HasPrefix(job.Error, "timed out") {
		t.Fatalf("job error %q; want the timeout", job.Error)
	}
	if got := ran(); got != "seat slow seat_compensate" {
		t.Fatalf("executions %q", got)
	}
}

// A job that ends within its timeout is not touched by it.
func TestJobWithinItsTimeoutSucceeds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	timeoutAgent(t, b)
	publishJobs(t, b, 1, "quick", `{"name":"quick","timeout":"1s","steps":[{"id":"a","action":"echo"},{"id":"b","action":"echo","depends_on":["a"]}]}`)
	job := b.waitJobWithin(t, "quick-0000", jobstore.JobSucceeded, 20*time.Second)
	if job.Deadline.IsZero() || job.TimedOut {
		t.Fatalf("deadline %v, timed_out %v", job.Deadline, job.TimedOut)
	}
	// Past its deadline nothing changes it.
	time.Sleep(time.Until(job.Deadline.Add(200 * time.Millisecond)))
	again := b.waitJobWithin(t, "quick-0000", jobstore.JobSucceeded, time.Second)
	if again.TimedOut || again.Error != "" {
		t.Fatalf("after its deadline: timed_out %v, error %q", again.TimedOut, again.Error)
	}
}

// `warden job retry` of a job that timed out runs it again with its
// timeout started afresh: the reopened job is neither cancelled at once
// (its old deadline passed) nor marked timed out.
func TestRetryOfATimedOutJobStartsItsTimeoutAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "a1", Pool: "default"})
	var mu sync.Mutex
	runs := 0
	a.Script(func(ctx context.Context, task *agent.Task) (any, error) {
		mu.Lock()
		runs++
		first := runs == 1
		mu.Unlock()
		if first {
			<-ctx.Done() // the first run outlives the job's timeout
			return nil, ctx.Err()
		}
		return "ok", nil
	})
	publishJobs(t, b, 1, "again", `{"name":"again","timeout":"2s","steps":[{"id":"slow","action":"echo"}]}`)
	failed := b.waitJobWithin(t, "again-0000", jobstore.JobFailed, 20*time.Second)
	if !failed.TimedOut {
		t.Fatalf("job failed without timing out: %s", failed.Error)
	}
	if _, err := ops.New(b.nc, b.store).RetryJob(context.Background(), failed.ID); err != nil {
		t.Fatal(err)
	}
	job := b.waitJobWithin(t, "again-0000", jobstore.JobSucceeded, 20*time.Second)
	if job.TimedOut || !job.Deadline.After(failed.Deadline) {
		t.Fatalf("retried job: timed_out %v, deadline %v (was %v)", job.TimedOut, job.Deadline, failed.Deadline)
	}
}

// A delayed job's timeout counts from its release, not its submission:
// the wait for its start is not its run.
func TestDelayedJobsTimeoutCountsFromItsRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	timeoutAgent(t, b)
	submitted := time.Now()
	publishJobs(t, b, 1, "later", `{"name":"later","delay":"2s","timeout":"1s","steps":[{"id":"a","action":"echo"}]}`)
	job := b.waitJobWithin(t, "later-0000", jobstore.JobSucceeded, 20*time.Second)
	if job.TimedOut || job.CreatedAt.Before(submitted.Add(2*time.Second)) || !job.Deadline.Equal(job.CreatedAt.Add(time.Second)) {
		t.Fatalf("submitted %s: created %s, deadline %s, timed_out %v; want the deadline a second after its release",
			submitted.Format(time.StampMilli), job.CreatedAt.Format(time.StampMilli), job.Deadline.Format(time.StampMilli), job.TimedOut)
	}
}

// A job that waits for an agent its pool never gets (parked in its
// scheduler's memory, no result to come) times out too: its waiting step
// is cancelled and the job fails.
func TestWaitingJobTimesOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	publishJobs(t, b, 1, "nobody", `{"name":"nobody","timeout":"1s","steps":[{"id":"a","action":"echo","pool":"absent"}]}`)
	job := b.waitJobWithin(t, "nobody-0000", jobstore.JobFailed, 20*time.Second)
	st, _, err := b.store.Step(context.Background(), job.ID, "a")
	if err != nil {
		t.Fatal(err)
	}
	if !job.TimedOut || st.State != jobstore.StepCancelled || !strings.Contains(st.LastError, "timed out") {
		t.Fatalf("job %s (%s, timed_out %v); step %s (%s)", job.State, job.Error, job.TimedOut, st.State, st.LastError)
	}
}

// A timed-out job is counted once in warden_jobs_timed_out_total, and
// ends counted failed.
func TestJobTimeoutIsCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := prometheus.NewRegistry()
	b.startScheduler(t, scheduler.Config{}, scheduler.WithMetrics(scheduler.NewMetrics(reg)))
	timeoutAgent(t, b)
	publishJobs(t, b, 1, "counted", `{"name":"counted","timeout":"1s","steps":[{"id":"slow","action":"echo"}]}`)
	b.waitJobWithin(t, "counted-0000", jobstore.JobFailed, 20*time.Second)
	natstest.Eventually(t, 10*time.Second, "the job's end counted", func() bool {
		return counter(t, reg, "warden_jobs_finished_total", "failed") == 1
	})
	if got := counter(t, reg, "warden_jobs_timed_out_total", ""); got != 1 {
		t.Fatalf("warden_jobs_timed_out_total = %v, want 1", got)
	}
}

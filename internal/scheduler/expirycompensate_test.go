package scheduler_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/test/handagent"
)

// scriptedAgent starts agent a1 of pool default running script, and
// returns the steps it ran, in order.
func scriptedAgent(t *testing.T, b *bundle, script func(task *agent.Task) error) func() string {
	t.Helper()
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "a1", Pool: "default"})
	var mu sync.Mutex
	var order []string
	a.Script(func(ctx context.Context, task *agent.Task) (any, error) {
		mu.Lock()
		order = append(order, task.StepID)
		mu.Unlock()
		if err := script(task); err != nil {
			return nil, err
		}
		return "ok", nil
	})
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(order, " ")
	}
}

// A step's expiry bounds when it may start, not how long a started one
// retries. charge (ttl 3s) fails retriably and its backoff (30s) ends past
// its expiry: it fails with its own error, and seat, which succeeded, is
// undone. It ended expired ("not started by …", which it had been), the
// job expired, and seat stayed reserved.
func TestRetryPastExpiryFailsWithItsErrorAndCompensates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	ran := scriptedAgent(t, b, func(task *agent.Task) error {
		if task.StepID == "charge" {
			return agent.Retriable(errors.New("payment gateway down"))
		}
		return nil
	})
	publishJobs(t, b, 1, "pay", `{"name":"pay","steps":[
 {"id":"seat","action":"echo","compensate":{"action":"echo"}},
 {"id":"charge","action":"echo","depends_on":["seat"],"ttl":"3s","max_retries":3,
  "retry":{"base_backoff":"30s","max_backoff":"30s"}}]}`)
	job := b.waitJobWithin(t, "pay-0000", jobstore.JobCompensated, 20*time.Second)
	st, _, err := b.store.Step(context.Background(), "pay-0000", "charge")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != jobstore.StepFailed || !strings.HasPrefix(st.LastError, "payment gateway down") {
		t.Fatalf("charge %s with error %q; want failed with its own error", st.State, st.LastError)
	}
	if !strings.Contains(job.Error, "step charge failed: payment gateway down") {
		t.Fatalf("job error %q; want charge's failure", job.Error)
	}
	if got := ran(); got != "seat charge seat_compensate" {
		t.Fatalf("executions %q", got)
	}
	t.Logf("job %s (%s); charge %s (%s)", job.State, job.Error, st.State, st.LastError)
}

// A step that expires before it could start ends its job as surely as one
// that failed: the steps that succeeded are undone. car (no agent of its
// pool, ttl 1s) expires after seat succeeded; the job compensates and its
// error names the expiry. It ended expired with seat left reserved.
func TestExpiredStepCompensatesCompletedSteps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{WaitRetry: protocol.Duration(100 * time.Millisecond)})
	ran := scriptedAgent(t, b, func(*agent.Task) error { return nil })
	publishJobs(t, b, 1, "trip", `{"name":"trip","steps":[
 {"id":"seat","action":"echo","compensate":{"action":"echo"}},
 {"id":"car","action":"echo","pool":"nobody","depends_on":["seat"],"ttl":"1s"}]}`)
	job := b.waitJobWithin(t, "trip-0000", jobstore.JobCompensated, 20*time.Second)
	st, _, err := b.store.Step(context.Background(), "trip-0000", "car")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != jobstore.StepExpired || !strings.Contains(job.Error, "step car expired: not started by") {
		t.Fatalf("car %s; job error %q", st.State, job.Error)
	}
	if got := ran(); got != "seat seat_compensate" {
		t.Fatalf("executions %q", got)
	}
	natstest.Eventually(t, 5*time.Second, "a job_compensating event", func() bool {
		evs, err := events.List(context.Background(), b.js, protocol.EventJobCompensating, 0)
		return err == nil && len(evs) == 1 && evs[0].JobID == job.ID
	})
	t.Logf("job %s (%s)", job.State, job.Error)
}

// A retry's task that expired in an agent's queue was reported "expired:
// not started by …" (by an agent that had not run the attempt before, or
// any protocol agent), and that became the step's last error: the step
// read as one that never ran, its real failure only in the attempts. It
// now fails with the attempt before's error, as a retry whose backoff
// ends past the expiry does. A handler's own failure that starts
// "expired:" (it ran) is its error as it stands.
func TestRetryExpiredInTheQueueKeepsTheStepsError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		unrun   bool // reported as an agent reports a task it did not run
		lastErr string
	}{
		{"expired unrun", true, "disk full on /var (not retried: its expires_at"},
		{"handler's own error", false, "expired: session token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.startScheduler(t, scheduler.Config{})
			a := handagent.Start(t, b.js, "default", "a1", nil)
			held := make(chan protocol.Task, 1)
			release := make(chan struct{})
			defer close(release)
			a.Reply(func(task protocol.Task) protocol.Result {
				if task.Attempt == 1 {
					return protocol.Result{Status: protocol.ResultFailed, Error: "disk full on /var", ErrorClass: protocol.ClassRetriable}
				}
				if !tc.unrun {
					return protocol.Result{Status: protocol.ResultFailed, Error: "expired: session token", ErrorClass: protocol.ClassPermanent}
				}
				held <- task // the retry waits "in the queue": reported below, by hand
				<-release
				return protocol.Result{Status: protocol.ResultSucceeded}
			})
			publishJobs(t, b, 1, "exp", `{"name":"exp","steps":[{"id":"s","action":"echo","ttl":"2s","max_retries":3,
  "retry":{"base_backoff":"100ms","max_backoff":"100ms"}}]}`)
			if tc.unrun {
				var task protocol.Task
				select {
				case task = <-held:
				case <-time.After(20 * time.Second):
					t.Fatal("the retry was not dispatched")
				}
				for !time.Now().After(task.ExpiresAt) {
					time.Sleep(time.Until(task.ExpiresAt) + time.Millisecond) // received past its expiry, as the report says
				}
				now := time.Now().UTC()
				r := protocol.Result{JobID: task.JobID, StepID: task.StepID, Epoch: task.Epoch, Token: task.Token, Agent: "a1", Pool: "default",
					Status: protocol.ResultFailed, Error: "expired: not started by " + task.ExpiresAt.UTC().Format(time.RFC3339),
					ErrorClass: protocol.ClassPermanent, StartedAt: now, FinishedAt: now}
				if err := handagent.PublishResult(context.Background(), b.js, r); err != nil {
					t.Fatal(err)
				}
			}
			b.waitJobWithin(t, "exp-0000", jobstore.JobFailed, 20*time.Second)
			st, _, err := b.store.Step(context.Background(), "exp-0000", "s")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(st.LastError, tc.lastErr) || st.Attempt != 2 {
				t.Fatalf("step %s after attempt %d with error %q; want %q...", st.State, st.Attempt, st.LastError, tc.lastErr)
			}
			if n := len(st.Attempts); n != 2 || !strings.HasPrefix(st.Attempts[1].Error, "expired:") {
				t.Fatalf("attempts %+v; want the second to keep the agent's words", st.Attempts)
			}
		})
	}
}

// A compensation whose job record landed while its undo step's record
// did not (the scheduler died between them: the record is created after
// the job record that names it) is completed by the next scheduler as
// startCompensation makes undo steps: at now, from the undo's own spec.
// Built from the job's spec and creation time, the undo of a job with a
// ttl had its expiry from the job's creation, was expired unrun, and the
// job ended compensation_failed with nothing undone.
//
// Old code: "undo step expired (expired: …), want it dispatched".
func TestUndoCompletedAfterACrashRunsWhateverTheJobsTTL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	startMute(t, b, "mute-1")
	agentSeen(t, b)
	ctx := context.Background()
	created := time.Now().UTC().Add(-2 * time.Hour)
	const id = "job-undo-complete"
	sp := spec.Job{Name: "undo-complete", TTL: protocol.Duration(time.Hour), Steps: []spec.Step{
		{ID: "a", Action: "echo", Compensate: &spec.Compensation{Action: "echo"}}, {ID: "x", Action: "echo"}}}
	steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, created)
	if err != nil {
		t.Fatal(err)
	}
	steps[0].State, steps[0].FinishedAt = jobstore.StepSucceeded, created.Add(time.Minute)
	steps[1].Expire(created.Add(time.Hour))
	job := jobstore.NewJob(id, sp, created)
	undo, _ := sp.Steps[0].CompensationStep()
	job.ForwardSteps, job.State = len(sp.Steps), jobstore.JobCompensating
	job.Spec.Steps = append(job.Spec.Steps, undo)
	if _, err := b.store.CreateJob(ctx, job); err != nil {
		t.Fatal(err)
	}
	for _, st := range steps {
		if _, err := b.store.CreateStep(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	advance(t, b, id)
	var st *jobstore.Step
	natstest.Eventually(t, 10*time.Second, "the undo step's record", func() bool {
		st, _, err = b.store.Step(ctx, id, undo.ID)
		return err == nil && st.State != jobstore.StepPending
	})
	if st.State != jobstore.StepDispatched {
		t.Fatalf("undo step %s (%s), want it dispatched", st.State, st.LastError)
	}
}

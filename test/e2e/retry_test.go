package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/test/procs"
)

func TestTransientFailuresAreRetriedUntilAllSucceed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ledger := filepath.Join(t.TempDir(), "ledger")
	procs.Start(t, "scheduler", bins["scheduler"], "--server", e.srv.URL)
	for i := range 3 {
		id := fmt.Sprintf("w%d", i)
		e.testAgent(t, id, "x", ledger)
		natstest.Eventually(t, 10*time.Second, id+" present", func() bool { _, ok := e.presence(t, id); return ok })
	}
	const jobs = 300
	for i := range jobs {
		e.submit(t, fmt.Sprintf("job-t%03d", i),
			"name: t\nsteps: [{id: s, action: chance, params: {fail_rate: 0.3}, max_retries: 10, retry: {base_backoff: 50ms, max_backoff: 200ms}}]")
	}
	retried, maxAttempts := 0, 0
	natstest.Eventually(t, 120*time.Second, "all jobs finish", func() bool {
		for i := range jobs {
			j, _, err := e.store.Job(context.Background(), fmt.Sprintf("job-t%03d", i))
			if err != nil || !j.State.Terminal() {
				return false
			}
		}
		return true
	})
	for i := range jobs {
		id := fmt.Sprintf("job-t%03d", i)
		j, _, _ := e.store.Job(context.Background(), id)
		if j.State != jobstore.JobSucceeded {
			t.Errorf("job %s %s: %s", id, j.State, j.Error)
			continue
		}
		st := e.step(t, id, "s")
		if len(st.Attempts) > 1 {
			retried++
			for _, a := range st.Attempts[:len(st.Attempts)-1] {
				if a.Status != "failed" || a.Class != "retriable" || !strings.Contains(a.Error, "temporarily unavailable") {
					t.Errorf("job %s: retry chain entry %+v", id, a)
				}
			}
		}
		maxAttempts = max(maxAttempts, len(st.Attempts))
	}
	t.Logf("%d jobs succeeded, %d after retries, at most %d attempts", jobs, retried, maxAttempts)
	if retried < jobs/10 {
		t.Errorf("only %d of %d jobs were retried with a 30%% failure rate", retried, jobs)
	}
}

func TestPermanentFailureIsNotRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	procs.Start(t, "scheduler", bins["scheduler"], "--server", e.srv.URL)
	e.agent(t, "a1", "")
	natstest.Eventually(t, 10*time.Second, "agent present", func() bool { _, ok := e.presence(t, "a1"); return ok })
	// sleep with an invalid duration: the action's own validation error.
	e.submit(t, "job-perm", "name: p\nsteps: [{id: s, action: sleep, params: {duration: soon}, max_retries: 5}]")
	natstest.Eventually(t, 20*time.Second, "job fails", func() bool {
		j, _, err := e.store.Job(context.Background(), "job-perm")
		return err == nil && j.State == jobstore.JobFailed
	})
	st := e.step(t, "job-perm", "s")
	if st.Epoch != 1 || len(st.Attempts) != 1 || st.Attempts[0].Class != "permanent" {
		t.Fatalf("permanent failure retried or misclassified: epoch %d attempts %+v", st.Epoch, st.Attempts)
	}
}

func TestRetryPendingAcrossSchedulerRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ledger := filepath.Join(t.TempDir(), "ledger")
	sched := procs.Start(t, "scheduler", bins["scheduler"], "--server", e.srv.URL)
	e.testAgent(t, "w", "x", ledger)
	natstest.Eventually(t, 10*time.Second, "agent present", func() bool { _, ok := e.presence(t, "w"); return ok })
	e.submit(t, "job-restart", "name: r\nsteps: [{id: s, action: flaky, params: {fail_attempts: 1}, retry: {base_backoff: 3s, jitter: 0}}]")
	natstest.Eventually(t, 10*time.Second, "first attempt failed, retry pending", func() bool {
		st := e.step(t, "job-restart", "s")
		return st != nil && st.State == jobstore.StepPending && !st.NotBefore.IsZero()
	})
	st := e.step(t, "job-restart", "s")
	sched.Kill()
	procs.Start(t, "scheduler-2", bins["scheduler"], "--server", e.srv.URL)
	natstest.Eventually(t, 40*time.Second, "retry happens after the restart", func() bool {
		s := e.step(t, "job-restart", "s")
		return s != nil && s.State == jobstore.StepSucceeded
	})
	done := e.step(t, "job-restart", "s")
	if done.Epoch != 2 || done.Attempts[1].StartedAt.Before(st.NotBefore) {
		t.Fatalf("retry epoch %d started %s, backoff until %s", done.Epoch, done.Attempts[1].StartedAt, st.NotBefore)
	}
	t.Logf("retry dispatched %s after its backoff ended, by the restarted scheduler", done.Attempts[1].StartedAt.Sub(st.NotBefore).Round(time.Millisecond))
}

package scheduler_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/handagent"
)

// Cancelling a running 1,000-step job: from the moment CancelJob returns no
// step is dispatched, every step ends (pending ones cancelled, running ones
// when their agent stops them) and the job ends cancelled, never succeeded.
func TestCancelOfARunningLargeJobIsFinal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	var mu sync.Mutex
	received := map[string]time.Time{}
	for i := range 4 {
		a := handagent.Start(t, b.js, "default", fmt.Sprintf("c-%d", i), nil)
		a.Reply(func(task protocol.Task) protocol.Result {
			mu.Lock()
			received[task.StepID] = time.Now()
			mu.Unlock()
			time.Sleep(50 * time.Millisecond)
			return protocol.Result{Status: protocol.ResultSucceeded}
		})
	}
	var sb strings.Builder
	sb.WriteString(`{"name":"big","steps":[`)
	for i := range 1000 {
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, `{"id":"s%04d","action":"echo"}`, i)
	}
	sb.WriteString("]}")
	b.submitNoReply(t, []byte(sb.String()), "job-cancel-big")
	natstest.Eventually(t, 30*time.Second, "steps running", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(received) >= 100
	})
	o := ops.New(b.nc, b.store)
	start := time.Now()
	rep, err := o.CancelJob(context.Background(), "job-cancel-big")
	if err != nil {
		t.Fatal(err)
	}
	effective := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	j, err := o.WaitJob(ctx, "job-cancel-big", 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cancel recorded in %s (%d pending cancelled, %d running told to stop); job %s %s after the cancel began",
		effective.Sub(start).Round(time.Millisecond), len(rep.Cancelled), len(rep.Interrupted), j.State, time.Since(start).Round(time.Millisecond))
	if j.State != jobstore.JobCancelled {
		t.Fatalf("job ended %s, want cancelled", j.State)
	}
	steps, err := b.store.Steps(context.Background(), j)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	late, cancelled := 0, 0
	for _, s := range steps {
		if !s.State.Terminal() {
			t.Fatalf("step %s is %s after the job ended", s.ID, s.State)
		}
		if s.State == jobstore.StepCancelled {
			cancelled++
		}
		if at, ok := received[s.ID]; ok && at.After(effective) && s.Attempts[len(s.Attempts)-1].StartedAt.After(effective) {
			late++
		}
	}
	if late > 0 {
		t.Fatalf("%d steps were dispatched after the cancel took effect", late)
	}
	if cancelled == 0 {
		t.Fatal("no step was cancelled")
	}
}

// A cancel handled by a scheduler that does not own the job (advance
// requests go to any scheduler) leaves the owner's cached copy stale, and
// a waiting job's wakes write nothing, so no lost CAS corrects it: the
// owner kept the cancelled jobs' submissions unacknowledged, extended for
// ever. A wake wait_retry after the owner's last read reads the job again.
func TestCancelElsewhereReleasesTheOwnersHeldMessages(t *testing.T) {
	t.Parallel()
	b := onePartition(t)
	cfg := scheduler.Config{Partitions: 1, WaitRetry: protocol.Duration(time.Second)}
	b.startScheduler(t, cfg)
	b.startScheduler(t, cfg)
	const n = 12
	for i := range n {
		b.submitNoReply(t, []byte(`{"name":"gpu","steps":[{"id":"s","action":"echo","pool":"gpu"}]}`), fmt.Sprintf("job-z-%02d", i))
	}
	for i := range n {
		id := fmt.Sprintf("job-z-%02d", i)
		natstest.Eventually(t, 10*time.Second, id+" waiting for the gpu pool", func() bool {
			st, _, err := b.store.Step(context.Background(), id, "s")
			return err == nil && st.State == jobstore.StepPending && st.Waiting != ""
		})
	}
	// Through either scheduler: each has its share of the requests.
	cl := client.New(b.js, client.Options{})
	for i := range n {
		if _, err := cl.Cancel(context.Background(), fmt.Sprintf("job-z-%02d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		b.waitJobWithin(t, fmt.Sprintf("job-z-%02d", i), jobstore.JobCancelled, 10*time.Second)
	}
	natstest.Eventually(t, 15*time.Second, "no cancelled job's submission held", func() bool {
		return pending(t, b.js, protocol.StreamSubmit) == 0
	})
}

// A waiting job whose records vanish (an operator purged them) stops
// waiting once the wait_retry reload finds it gone: its waiter stood, and
// its submission stayed held, extended for good, against the partition's
// hold budget.
func TestWaitingJobWhoseRecordsVanishLetsGo(t *testing.T) {
	t.Parallel()
	b := onePartition(t)
	b.startScheduler(t, scheduler.Config{Partitions: 1, WaitRetry: protocol.Duration(time.Second)})
	b.submitNoReply(t, []byte(`{"name":"gpu","steps":[{"id":"s","action":"echo","pool":"gpu"},{"id":"t","action":"echo","pool":"gpu"}]}`), "job-purged")
	natstest.Eventually(t, 10*time.Second, "job-purged waiting for the gpu pool", func() bool {
		st, _, err := b.store.Step(context.Background(), "job-purged", "s")
		return err == nil && st.State == jobstore.StepPending && st.Waiting != ""
	})
	if pending(t, b.js, protocol.StreamSubmit) != 1 {
		t.Fatal("the waiting job's submission is not held")
	}
	kv, err := b.js.KeyValue(context.Background(), protocol.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{protocol.JobKey("job-purged"), protocol.StepKey("job-purged", "s"), protocol.StepKey("job-purged", "t")} {
		if err := kv.Purge(context.Background(), k); err != nil {
			t.Fatal(err)
		}
	}
	natstest.Eventually(t, 15*time.Second, "the purged job's submission let go", func() bool {
		return pending(t, b.js, protocol.StreamSubmit) == 0
	})
}

// A cancel ends every pending step cancelled, dependents included: they
// were skipped behind the first, in the same write round as its own
// write, so that when that write lost its compare-and-set (the job's
// owner dispatched the step meanwhile) the skip landed anyway and the
// dependent went from skipped to cancelled later (the chaos suite's
// timed jobs: a double state transition).
func TestCancelEndsPendingDependentsCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	b.submitNoReply(t, []byte(`{"name":"chain","steps":[{"id":"a","action":"echo","pool":"absent"},
 {"id":"b","action":"echo","depends_on":["a"]},{"id":"c","action":"echo","depends_on":["b"]}]}`), "job-chain")
	natstest.Eventually(t, 10*time.Second, "the job is accepted", func() bool {
		_, _, err := b.store.Job(context.Background(), "job-chain")
		return err == nil
	})
	if _, err := ops.New(b.nc, b.store).CancelJob(context.Background(), "job-chain"); err != nil {
		t.Fatal(err)
	}
	b.waitJob(t, "job-chain", jobstore.JobCancelled)
	for _, id := range []string{"a", "b", "c"} {
		st, _, err := b.store.Step(context.Background(), "job-chain", id)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != jobstore.StepCancelled {
			t.Errorf("step %s %s (%s), want cancelled", id, st.State, st.LastError)
		}
	}
}

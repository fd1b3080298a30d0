package scheduler_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/concurrency"
	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/handagent"
)

// keyState reads a concurrency key's live holders and waiters.
func keyState(t *testing.T, b *bundle, key string) concurrency.State {
	t.Helper()
	l, err := concurrency.New(context.Background(), b.js, concurrency.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := l.Inspect(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// keyed is a job of two steps, s holding concurrency key k (limit 1) for
// up to a minute, and t after it: two steps, so that s has a record of its
// own to edit.
func keyed(k string) []byte {
	return []byte(fmt.Sprintf(`{"name":"keyed","steps":[
 {"id":"s","action":"echo","timeout":"60s","concurrency":{"key":%q,"limit":1}},
 {"id":"t","action":"echo","depends_on":["s"]}]}`, k))
}

func waitDispatched(t *testing.T, b *bundle, job, step string) *jobstore.Step {
	t.Helper()
	return waitStep(t, b, job, step, jobstore.StepDispatched)
}

// A step that ends without a result (the supervisor dead-letters it, or
// ends it cancelled when its agent never confirmed) gives its slot back
// when its job advances. Only a result released it; other jobs on the key
// waited out the slot's lease (the step's timeout, its dispatch grace and
// a second: here 61 s).
func TestSlotOfAStepEndedWithoutAResultIsFreed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	startHolder(t, b)
	b.submitNoReply(t, keyed("k-park"), "job-parked")
	waitDispatched(t, b, "job-parked", "s")
	// What the supervisor's park writes, then its advance.
	b.editStep(t, "job-parked", "s", func(st *jobstore.Step) {
		now := time.Now().UTC()
		st.State, st.LastError, st.UpdatedAt, st.FinishedAt = jobstore.StepDeadLettered, "parked by the test", now, now
	})
	b.advance(t, "job-parked")
	b.submitNoReply(t, keyed("k-park"), "job-next")
	natstest.Eventually(t, 10*time.Second, "job-next's step holding the key", func() bool {
		return slices.Contains(keyState(t, b, "k-park").Holders, "job-next.s")
	})
}

// A result judged on a stale cached copy of its job (another scheduler
// dispatched the step again since) did free the step's slot before the
// turn's write found the copy stale: the re-dispatch ran without it, and
// another job on the key beside it. A slot is freed only once the result's
// write landed.
func TestStaleResultKeepsTheRunningStepsSlot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	startHolder(t, b)
	b.submitNoReply(t, keyed("k-stale"), "job-stale")
	st := waitDispatched(t, b, "job-stale", "s")
	// Another scheduler's dispatch of the step at epoch 2, which this
	// scheduler's cache has not seen.
	b.editStep(t, "job-stale", "s", func(s *jobstore.Step) {
		s.Epoch++
		s.Actor = "elsewhere"
		s.LockedUntil = time.Now().Add(time.Minute).UTC()
	})
	now := time.Now().UTC()
	if err := handagent.PublishResult(context.Background(), b.js, protocol.Result{JobID: "job-stale", StepID: "s", Epoch: st.Epoch,
		Agent: "holder", Pool: "default", Status: protocol.ResultSucceeded, StartedAt: now, FinishedAt: now, Token: st.Token}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, "the epoch-1 result dropped as stale", func() bool {
		return len(b.events(t, protocol.EventStaleResult, "job-stale")) > 0
	})
	if ks := keyState(t, b, "k-stale"); !slices.Contains(ks.Holders, "job-stale.s") {
		t.Fatalf("key k-stale: holders %v, waiters %v; want job-stale.s still holding it (its epoch 2 runs)", ks.Holders, ks.Waiters)
	}
}

// A step cancelled (or expired) while queued for a key leaves the queue:
// it stayed at the head, a freed slot went to it, and the steps behind it
// waited for its wait lease to end (up to 45 s).
func TestCancelledWaiterLeavesTheKeysQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	release := startHolder(t, b)
	for _, id := range []string{"job-q1", "job-q2", "job-q3"} {
		b.submitNoReply(t, keyed("k-queue"), id)
		if id == "job-q1" {
			waitDispatched(t, b, id, "s")
		}
	}
	natstest.Eventually(t, 10*time.Second, "job-q2 and job-q3 queued for the key", func() bool {
		return len(keyState(t, b, "k-queue").Waiters) == 2
	})
	if _, err := client.New(b.js, client.Options{}).Cancel(context.Background(), "job-q2"); err != nil {
		t.Fatal(err)
	}
	b.waitJobWithin(t, "job-q2", jobstore.JobCancelled, 10*time.Second)
	release()
	b.waitJobWithin(t, "job-q3", jobstore.JobSucceeded, 10*time.Second)
}

// An agent outside a cluster that answers every task with the class
// reroute (a member's refusal: here a handler error that names the class)
// fails the step through its retries: the scheduler routed it again four
// times a second for ever, counting nothing.
func TestRerouteOutsideAClusterEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "refuser", Pool: "default"})
	a.Script(func(context.Context, *agent.Task) (any, error) { return nil, refusal{} })
	b.submitNoReply(t, []byte(`{"name":"r","steps":[{"id":"s","action":"echo","max_retries":1,"retry":{"base_backoff":"10ms","max_backoff":"10ms"}}]}`), "job-refused")
	job := b.waitJobWithin(t, "job-refused", jobstore.JobFailed, 15*time.Second)
	t.Logf("job %s: %s", job.State, job.Error)
}

// refusal is an error of class reroute.
type refusal struct{}

func (refusal) Error() string      { return "not mine" }
func (refusal) ErrorClass() string { return protocol.ClassReroute }

// An agent's assessment that ages out of the health bucket (no supervisor
// leader rewrites it) is forgotten by running schedulers: the bucket aged
// records out without a word to watchers, and an agent once judged
// critical stayed excluded in every running scheduler (while one started
// later took it for healthy).
func TestExpiredAssessmentIsForgotten(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	ctx := context.Background()
	// The bucket as the scheduler made it, with records aging out in 2 s.
	s, err := b.js.Stream(ctx, "KV_"+protocol.BucketHealth)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxAge, cfg.Duplicates = 2*time.Second, time.Second
	if _, err := b.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	agenttest.StartAgent(t, b.nc, agent.Config{ID: "judged", Pool: "default"})
	kv, err := b.js.KeyValue(ctx, protocol.BucketHealth)
	if err != nil {
		t.Fatal(err)
	}
	rec := health.Record{Agent: "judged", Pool: "default", Assessment: health.Assessment{Score: 0.1, Level: health.Critical, AssessedAt: time.Now().UTC()}}
	if _, err := kv.Put(ctx, rec.Key(), mustJSON(t, rec)); err != nil {
		t.Fatal(err)
	}
	// A job submitted once the scheduler has the assessment waits: the
	// watch is asynchronous, so a job submitted before it may run at once.
	var id string
	for n := 0; id == ""; n++ {
		if n == 20 {
			t.Fatal("no job waited for the critical agent")
		}
		probe := fmt.Sprintf("job-judged-%02d", n)
		b.submitNoReply(t, []byte(`{"name":"h","steps":[{"id":"s","action":"echo"}]}`), probe)
		deadline := time.Now().Add(2 * time.Second)
		for time.Now().Before(deadline) && id == "" {
			st, _, err := b.store.Step(ctx, probe, "s")
			if err == nil && st.State == jobstore.StepPending && strings.Contains(st.Waiting, "critical") {
				id = probe
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	b.waitJobWithin(t, id, jobstore.JobSucceeded, 15*time.Second)
}

// An advance request whose reply subject is not an inbox is made but not
// answered: the scheduler's answer, which its response permission lets
// through wherever the requester points it, wrote a junk record into the
// job store (or a lease, a presence key).
func TestAdvanceAnswersOnlyAnInbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	b.submitNoReply(t, []byte(`{"name":"a","steps":[{"id":"s","action":"echo","pool":"nobody"}]}`), "job-adv")
	natstest.Eventually(t, 10*time.Second, "job-adv stored", func() bool {
		_, _, err := b.store.Job(context.Background(), "job-adv")
		return err == nil
	})
	kv, err := b.js.KeyValue(context.Background(), protocol.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	target := "$KV." + protocol.BucketJobs + ".job.forged"
	// A good request first: once it is answered, the scheduler has taken
	// the bad one, sent before it on the same connection.
	if err := b.nc.PublishRequest(protocol.SubjectControlAdvance, target, []byte("job-adv")); err != nil {
		t.Fatal(err)
	}
	b.advance(t, "job-adv")
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(context.Background(), "job.forged"); err == nil {
		t.Fatalf("the advance's answer was written to the job store: %q", e.Value())
	}
}

// A result whose step record landed frees its slot even when another
// write of the same turn failed (here the seal of a sibling step's record,
// changed meanwhile): applied again, the result finds its step ended and
// frees nothing, and the slot waited for its lease.
func TestSlotFreedWhenTheTurnFailsAfterItsWriteLanded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	release := startHolder(t, b)
	b.submitNoReply(t, []byte(`{"name":"two","steps":[
 {"id":"s","action":"echo","timeout":"60s","concurrency":{"key":"k-landed","limit":1}},
 {"id":"t","action":"echo","agent":"other","depends_on":["s"]}]}`), "job-landed")
	waitDispatched(t, b, "job-landed", "s")
	// t's record changes under the scheduler's cached copy (as a
	// supervisor's or a client's write would).
	b.editStep(t, "job-landed", "t", func(s *jobstore.Step) { s.UpdatedAt = time.Now().UTC() })
	// s succeeds: its record lands; t, ready now, waits for an agent that
	// never comes, and its record's write in the same turn conflicts.
	release()
	natstest.Eventually(t, 10*time.Second, "s succeeded", func() bool {
		st, _, err := b.store.Step(context.Background(), "job-landed", "s")
		return err == nil && st.State == jobstore.StepSucceeded
	})
	natstest.Eventually(t, 10*time.Second, "k-landed free", func() bool {
		return len(keyState(t, b, "k-landed").Holders) == 0
	})
}

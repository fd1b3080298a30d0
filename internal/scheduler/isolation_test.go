package scheduler_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ratelimit"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
	"github.com/wardenhq/warden/test/handagent"
)

// A job of 1,000 steps cannot hold back small jobs submitted with it: its
// results and dispatches are handled in slices, interleaved with the other
// jobs' inputs, so the 200 single-step jobs all finish before it does.
func TestLargeJobDoesNotStallSmallOnes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	for i := range 4 {
		handagent.Start(t, b.js, "default", fmt.Sprintf("iso-%d", i), nil)
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
	b.submitNoReply(t, []byte(sb.String()), "job-big")
	// Submitted together (natstest.PublishAll), not spread out by the
	// test's own round trips.
	var small []string
	var msgs []*nats.Msg
	for i := range 200 {
		id := fmt.Sprintf("job-small-%03d", i)
		small = append(small, id)
		msgs = append(msgs, &nats.Msg{Subject: protocol.SubmitSubject(id), Data: []byte(`{"name":"small","steps":[{"id":"s","action":"echo"}]}`)})
	}
	natstest.PublishAll(t, b.js, msgs...)
	big := b.waitJobWithin(t, "job-big", jobstore.JobSucceeded, 120*time.Second)
	var last time.Time
	for _, id := range small {
		j := b.waitJobWithin(t, id, jobstore.JobSucceeded, 10*time.Second)
		if j.FinishedAt.After(last) {
			last = j.FinishedAt
		}
	}
	t.Logf("1,000-step job finished %s after submission; the last of 200 single-step jobs %s before it",
		big.FinishedAt.Sub(big.CreatedAt).Round(time.Millisecond), big.FinishedAt.Sub(last).Round(time.Millisecond))
	if !last.Before(big.FinishedAt) {
		t.Fatalf("the last single-step job finished at %s, after the 1,000-step job (%s)", last, big.FinishedAt)
	}
	steps, err := b.store.Steps(context.Background(), big)
	if err != nil || len(steps) != 1000 {
		t.Fatalf("big job has %d step records: %v", len(steps), err)
	}
	for _, s := range steps {
		if s.State != jobstore.StepSucceeded || s.Epoch != 1 {
			t.Fatalf("step %s: %s at epoch %d", s.ID, s.State, s.Epoch)
		}
	}
}

func (b *bundle) waitJobWithin(t *testing.T, id string, want jobstore.JobState, d time.Duration) *jobstore.Job {
	t.Helper()
	var job *jobstore.Job
	natstest.Eventually(t, d, "job "+id+" "+string(want), func() bool {
		j, _, err := b.store.Job(context.Background(), id)
		if err != nil {
			return false
		}
		job = j
		return j.State == want
	})
	return job
}

// Jobs waiting for a pool with no agents cannot stall a partition for the
// other pools: more of them than the partition consumer's max_ack_pending
// (4,096) are submitted first, then one job for a pool that has an agent.
func TestJobsWaitingForAnAbsentPoolDoNotStallThePartition(t *testing.T) {
	t.Parallel()
	b := onePartition(t)
	b.startScheduler(t, scheduler.Config{Partitions: 1})
	handagent.Start(t, b.js, "default", "present-1", nil)
	const waiting = 4200
	var msgs []*nats.Msg
	for i := range waiting {
		msgs = append(msgs, &nats.Msg{Subject: protocol.SubmitSubject(fmt.Sprintf("job-gpu-%04d", i)),
			Data: []byte(`{"name":"gpu","steps":[{"id":"s","action":"echo","pool":"gpu"}]}`)})
	}
	natstest.PublishAll(t, b.js, msgs...)
	// The last of them is stored waiting: every one before it was taken.
	natstest.Eventually(t, 60*time.Second, "the last gpu job stored, waiting", func() bool {
		j, _, err := b.store.Job(context.Background(), fmt.Sprintf("job-gpu-%04d", waiting-1))
		return err == nil && j.State != jobstore.JobSucceeded
	})
	b.submitNoReply(t, []byte(`{"name":"small","steps":[{"id":"s","action":"echo"}]}`), "job-default")
	b.waitJobWithin(t, "job-default", jobstore.JobSucceeded, 20*time.Second)
	// Held or not, every waiting job starts when its pool's agents come.
	handagent.Start(t, b.js, "gpu", "gpu-1", nil)
	for i := range waiting {
		b.waitJobWithin(t, fmt.Sprintf("job-gpu-%04d", i), jobstore.JobSucceeded, 60*time.Second)
	}
}

// A high-priority step waiting for agents that are all busy holds back
// only the work that could use those agents: a low-priority step that
// another, idle agent of the same pool can run starts at once. Before, any
// higher step waiting for the pool held back every lower one, and the idle
// agent stayed idle until the low step had aged past it (3 × aging).
func TestHigherWorkHoldsBackOnlyTheAgentsItCouldUse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{CapacityRetry: protocol.Duration(50 * time.Millisecond), PriorityAging: protocol.Duration(time.Hour)})
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	gpu := agenttest.StartAgent(t, b.nc, agent.Config{ID: "gpu-1", Pool: "default", MaxConcurrent: 1, Capabilities: []string{"gpu"}})
	t.Cleanup(free) // before the agent stops: a held handler would hold its drain
	gpu.Script(func(ctx context.Context, task *agent.Task) (any, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return "ok", nil
	})
	plain := agenttest.StartAgent(t, b.nc, agent.Config{ID: "plain-1", Pool: "default", MaxConcurrent: 1})
	plain.Script(func(ctx context.Context, task *agent.Task) (any, error) { return "ok", nil })
	b.submitNoReply(t, []byte(`{"name":"busy","steps":[{"id":"s","action":"echo","requires":["gpu"]}]}`), "job-busy")
	natstest.Eventually(t, 10*time.Second, "the gpu agent busy", func() bool {
		st, _, err := b.store.Job(context.Background(), "job-busy")
		return err == nil && st.State == jobstore.JobRunning
	})
	b.submitNoReply(t, []byte(`{"name":"high","priority":"high","steps":[{"id":"s","action":"echo","requires":["gpu"]}]}`), "job-high")
	natstest.Eventually(t, 10*time.Second, "the high step waiting for the gpu agent", func() bool {
		j, _, err := b.store.Job(context.Background(), "job-high")
		return err == nil && len(j.Steps) == 1 && j.Steps[0].Waiting != ""
	})
	b.submitNoReply(t, []byte(`{"name":"low","priority":"low","steps":[{"id":"s","action":"echo"}]}`), "job-low")
	j := b.waitJobWithin(t, "job-low", jobstore.JobSucceeded, 10*time.Second)
	if actor := j.Steps[0].Actor; actor != "plain-1" {
		t.Fatalf("the low step ran on %s", actor)
	}
	free()
	if h := b.waitJobWithin(t, "job-high", jobstore.JobSucceeded, 10*time.Second); h.Steps[0].Actor != "gpu-1" {
		t.Fatalf("the high step ran on %s", h.Steps[0].Actor)
	}
}

// Bare submissions (on warden.submit) all come through one consumer that
// every scheduler shares: held for jobs waiting for a pool with no agents,
// 4,096 of them spread over the partitions stalled every later bare
// submission, whatever its pool. They are never held.
func TestBareSubmissionsWaitingForAnAbsentPoolDoNotStallOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	handagent.Start(t, b.js, "default", "present-1", nil)
	const waiting = 4200
	var msgs []*nats.Msg
	for i := range waiting {
		m := nats.NewMsg(protocol.SubjectSubmit)
		m.Header.Set(protocol.HeaderJobID, fmt.Sprintf("job-bare-gpu-%04d", i))
		m.Data = []byte(`{"name":"gpu","steps":[{"id":"s","action":"echo","pool":"gpu"}]}`)
		msgs = append(msgs, m)
	}
	natstest.PublishAll(t, b.js, msgs...)
	natstest.Eventually(t, 60*time.Second, "the last bare gpu job stored", func() bool {
		_, _, err := b.store.Job(context.Background(), fmt.Sprintf("job-bare-gpu-%04d", waiting-1))
		return err == nil
	})
	m := nats.NewMsg(protocol.SubjectSubmit)
	m.Header.Set(protocol.HeaderJobID, "job-bare-default")
	m.Data = []byte(`{"name":"small","steps":[{"id":"s","action":"echo"}]}`)
	natstest.PublishAll(t, b.js, m)
	b.waitJobWithin(t, "job-bare-default", jobstore.JobSucceeded, 20*time.Second)
}

// Jobs held back by a rate limit keep their messages within the partition's
// hold budget, as jobs waiting for an agent do. Handed back with a delay, a
// message stays pending on its partition consumer all the same: 4,096 jobs
// behind a rate limit stopped their partition, and no other job of it was
// even stored.
func TestJobsBehindARateLimitDoNotStallThePartition(t *testing.T) {
	t.Parallel()
	b := onePartition(t)
	b.startScheduler(t, scheduler.Config{Partitions: 1,
		RateLimits: ratelimit.Config{"slow": {Limit: 1, Interval: protocol.Duration(time.Hour), Burst: 1}}})
	handagent.Start(t, b.js, "default", "present-1", nil)
	const gated = 4200
	var msgs []*nats.Msg
	for i := range gated {
		msgs = append(msgs, &nats.Msg{Subject: protocol.SubmitSubject(fmt.Sprintf("job-rl-%04d", i)),
			Data: []byte(`{"name":"rl","steps":[{"id":"s","action":"echo","rate_limit":"slow"}]}`)})
	}
	natstest.PublishAll(t, b.js, msgs...)
	natstest.Eventually(t, 90*time.Second, "the last rate-limited job stored", func() bool {
		_, _, err := b.store.Job(context.Background(), fmt.Sprintf("job-rl-%04d", gated-1))
		return err == nil
	})
	b.submitNoReply(t, []byte(`{"name":"small","steps":[{"id":"s","action":"echo"}]}`), "job-unrelated")
	b.waitJobWithin(t, "job-unrelated", jobstore.JobSucceeded, 20*time.Second)
	// The rate limit still holds them: one ran, the others wait for it.
	ran := 0
	for i := range gated {
		j, _, err := b.store.Job(context.Background(), fmt.Sprintf("job-rl-%04d", i))
		if err != nil {
			t.Fatalf("job-rl-%04d: %v", i, err)
		}
		if j.State == jobstore.JobSucceeded {
			ran++
		}
	}
	if ran != 1 {
		t.Errorf("%d rate-limited jobs ran under a limit of 1 an hour", ran)
	}
}

// The same for steps in a retry backoff, whose results' messages wait
// with them: within the hold budget, the partition's results consumer
// keeps delivering, and every other result of the partition is applied.
func TestStepsInABackoffDoNotStallThePartitionsResults(t *testing.T) {
	t.Parallel()
	b := onePartition(t)
	b.startScheduler(t, scheduler.Config{Partitions: 1})
	a := handagent.Start(t, b.js, "default", "present-1", nil)
	a.Reply(func(task protocol.Task) protocol.Result {
		if strings.HasPrefix(task.JobID, "job-flaky-") {
			return protocol.Result{Status: protocol.ResultFailed, Error: "flaky", ErrorClass: protocol.ClassRetriable}
		}
		return protocol.Result{Status: protocol.ResultSucceeded}
	})
	const flaky = 5000
	var msgs []*nats.Msg
	left := map[string]bool{}
	for i := range flaky {
		id := fmt.Sprintf("job-flaky-%04d", i)
		left[id] = true
		msgs = append(msgs, &nats.Msg{Subject: protocol.SubmitSubject(id),
			Data: []byte(`{"name":"flaky","steps":[{"id":"s","action":"echo","max_retries":1,"retry":{"base_backoff":"1h","max_backoff":"1h"}}]}`)})
	}
	natstest.PublishAll(t, b.js, msgs...)
	// Every one's result applied: a stalled consumer leaves some unread.
	natstest.Eventually(t, 120*time.Second, "every flaky job's step in its backoff", func() bool {
		for id := range left {
			st, _, err := b.store.Step(context.Background(), id, "s")
			if err != nil || st.State != jobstore.StepPending || st.Attempt == 0 {
				return false
			}
			delete(left, id)
		}
		return true
	})
	b.submitNoReply(t, []byte(`{"name":"small","steps":[{"id":"s","action":"echo"}]}`), "job-unrelated")
	b.waitJobWithin(t, "job-unrelated", jobstore.JobSucceeded, 20*time.Second)
}

// onePartition is setup with every job in one partition, so that one
// partition consumer's limits are what a test reaches.
func onePartition(t *testing.T) *bundle {
	t.Helper()
	srv, nc, js := natstest.Start(t, streams.Options{Partitions: 1})
	store, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{srv: srv, nc: nc, js: js, store: store}
}

package scheduler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/selection"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/test/handagent"
)

const diamond = `
name: diamond
steps:
  - {id: a, action: echo, params: {n: 1}}
  - {id: b, action: echo, depends_on: [a], requires: [docker]}
  - {id: c, action: echo, depends_on: [a]}
  - {id: d, action: echo, depends_on: [b, c]}
`

func TestDiamondRunsInDependencyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	plain := handagent.Start(t, b.js, "default", "plain", nil)
	docker := handagent.Start(t, b.js, "default", "docker", []string{"docker"})

	r := b.submit(t, []byte(diamond), "job-diamond", "")
	if r.Error != "" || r.JobID != "job-diamond" || r.Existing {
		t.Fatalf("reply %+v", r)
	}
	b.waitJob(t, "job-diamond", jobstore.JobSucceeded)

	finished := map[string]time.Time{}
	started := map[string]time.Time{}
	job, _, _ := b.store.Job(context.Background(), "job-diamond")
	steps, err := b.store.Steps(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if s.State != jobstore.StepSucceeded || s.Epoch != 1 {
			t.Fatalf("step %s: %s epoch %d", s.ID, s.State, s.Epoch)
		}
		started[s.ID] = s.Attempts[0].StartedAt
		finished[s.ID] = s.FinishedAt
	}
	for _, dep := range [][2]string{{"a", "b"}, {"a", "c"}, {"b", "d"}, {"c", "d"}} {
		if !started[dep[1]].After(finished[dep[0]]) && !started[dep[1]].Equal(finished[dep[0]]) {
			t.Errorf("%s dispatched at %s before %s finished at %s", dep[1], started[dep[1]], dep[0], finished[dep[0]])
		}
	}
	for _, task := range plain.Received() {
		if task.StepID == "b" {
			t.Errorf("step b (requires docker) went to an agent without it")
		}
	}
	if n := len(plain.Received()) + len(docker.Received()); n != 4 {
		t.Errorf("%d tasks executed, want 4", n)
	}
}

func TestRejectedSubmissionsLeaveNoJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{MaxSpecBytes: 4096})
	cases := []struct{ name, body, reason string }{
		{"malformed", "name: [", spec.ReasonMalformed},
		{"cyclic", "name: c\nsteps:\n- {id: a, action: echo, depends_on: [b]}\n- {id: b, action: echo, depends_on: [a]}\n", spec.ReasonCycle},
		{"oversized", "name: big\nsteps: [{id: a, action: echo, params: {x: '" + strings.Repeat("x", 5000) + "'}}]", spec.ReasonTooLarge},
		{"unknown field", "name: x\nstep: []", spec.ReasonUnknownField},
	}
	for _, c := range cases {
		r := b.submit(t, []byte(c.body), "job-"+strings.ReplaceAll(c.name, " ", "-"), "")
		if !strings.Contains(r.Error, c.reason) {
			t.Errorf("%s: reply error %q does not name %q", c.name, r.Error, c.reason)
		}
	}
	ids, err := b.store.JobIDs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 0 {
		t.Errorf("rejected submissions left jobs %v", ids)
	}
	// Each rejection is recorded as an event, and the submission stream is empty.
	natstest.Eventually(t, 5*time.Second, "rejection events", func() bool {
		s, _ := b.js.Stream(context.Background(), protocol.StreamEvents)
		info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(protocol.EventSubject(protocol.EventSubmissionRejected, ">")))
		return err == nil && info.State.Msgs == uint64(len(cases))
	})
	natstest.Eventually(t, 5*time.Second, "submissions removed", func() bool {
		s, _ := b.js.Stream(context.Background(), protocol.StreamSubmit)
		info, err := s.Info(context.Background())
		return err == nil && info.State.Msgs == 0
	})
}

func TestResubmissionReturnsSameJobWithoutSecondDispatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	agent := handagent.Start(t, b.js, "default", "a1", nil)
	body := []byte("name: once\nidempotency_key: deploy-7\nsteps: [{id: s, action: echo}]\n")
	id := protocol.JobIDForKey("deploy-7")
	r1 := b.submit(t, body, id, "deploy-7")
	b.waitJob(t, id, jobstore.JobSucceeded)
	// Past the stream's duplicate window the message reaches the scheduler
	// again; a different Nats-Msg-Id stands in for the window passing.
	r2 := b.submit(t, body, id, "deploy-7-after-window")
	if r1.JobID != id || r2.JobID != id || !r2.Existing {
		t.Fatalf("replies %+v %+v, want job %s twice, second existing", r1, r2, id)
	}
	if n := len(agent.Received()); n != 1 {
		t.Fatalf("%d dispatches, want 1", n)
	}
	if seq := lastSeq(t, b.js, protocol.TaskStream(protocol.Shard("default", "a1", 4))); seq != 1 {
		t.Fatalf("task stream holds %d tasks, want 1", seq)
	}
}

func TestStaleEpochResultDoesNotChangeStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	agent := handagent.Start(t, b.js, "default", "a1", nil)
	release := make(chan struct{})
	var once sync.Once
	agent.Reply(func(task protocol.Task) protocol.Result {
		// Hold the real result until the stale one has been handled.
		<-release
		return protocol.Result{Status: protocol.ResultSucceeded}
	})
	t.Cleanup(func() { once.Do(func() { close(release) }) })

	b.submit(t, []byte("name: s\nsteps: [{id: s, action: echo}]"), "job-stale", "")
	natstest.Eventually(t, 10*time.Second, "dispatched", func() bool {
		st, _, err := b.store.Step(context.Background(), "job-stale", "s")
		return err == nil && st.State == jobstore.StepDispatched
	})
	before, rev, _ := b.store.Step(context.Background(), "job-stale", "s")
	stale := protocol.Result{JobID: "job-stale", StepID: "s", Epoch: before.Epoch + 7, Agent: "impostor", Pool: "default",
		Status: protocol.ResultFailed, Error: "late", FinishedAt: time.Now()}
	if err := handagent.PublishResult(context.Background(), b.js, stale); err != nil {
		t.Fatal(err)
	}
	// The scheduler records every stale result as an event; wait for it.
	natstest.Eventually(t, 10*time.Second, "stale event", func() bool {
		s, _ := b.js.Stream(context.Background(), protocol.StreamEvents)
		info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(protocol.EventSubject(protocol.EventStaleResult, "job-stale")))
		return err == nil && info.State.Msgs == 1
	})
	after, rev2, _ := b.store.Step(context.Background(), "job-stale", "s")
	if rev2 != rev || after.State != jobstore.StepDispatched || after.LastError != "" {
		t.Fatalf("stale result changed the step: rev %d->%d state %s error %q", rev, rev2, after.State, after.LastError)
	}
	once.Do(func() { close(release) })
	b.waitJob(t, "job-stale", jobstore.JobSucceeded)
}

func TestTwoSchedulersDispatchEachStepOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{Workers: 4})
	b.startScheduler(t, scheduler.Config{Workers: 4})
	agents := []*handagent.Agent{
		handagent.Start(t, b.js, "default", "a1", nil),
		handagent.Start(t, b.js, "default", "a2", nil),
		handagent.Start(t, b.js, "default", "a3", nil),
	}
	const jobs = 200
	var ids []string
	for i := range jobs {
		id := fmt.Sprintf("job-%03d", i)
		ids = append(ids, id)
		body := fmt.Sprintf(`{"name":"n%d","steps":[{"id":"a","action":"echo"},{"id":"b","action":"echo","depends_on":["a"]},{"id":"c","action":"echo","depends_on":["a"]}]}`, i)
		b.submit(t, []byte(body), id, "")
	}
	for _, id := range ids {
		b.waitJob(t, id, jobstore.JobSucceeded)
	}
	seen := map[string]int{}
	for _, a := range agents {
		for _, task := range a.Received() {
			seen[task.JobID+"."+task.StepID]++
		}
	}
	if len(seen) != jobs*3 {
		t.Fatalf("%d distinct steps executed, want %d", len(seen), jobs*3)
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("step %s dispatched %d times", k, n)
		}
	}
	for _, id := range ids {
		job, _, _ := b.store.Job(context.Background(), id)
		steps, _ := b.store.Steps(context.Background(), job)
		for _, s := range steps {
			if s.Epoch != 1 {
				t.Errorf("%s.%s epoch %d, want 1", id, s.ID, s.Epoch)
			}
		}
	}
}

func TestUnknownActionFailsJobWithReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, noStartGrace(scheduler.Config{}))
	handagent.Start(t, b.js, "default", "a1", nil)
	b.submit(t, []byte("name: typo\nsteps: [{id: s, action: deplyo}]"), "job-typo", "")
	job := b.waitJob(t, "job-typo", jobstore.JobFailed)
	if !strings.Contains(job.Error, `unknown action "deplyo"`) || !strings.Contains(job.Error, "echo") {
		t.Fatalf("job error %q does not name the action and what is offered", job.Error)
	}
}

func TestFailedStepSkipsDependentsAndFailsJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	agent := handagent.Start(t, b.js, "default", "a1", []string{"docker"})
	agent.Reply(func(task protocol.Task) protocol.Result {
		if task.StepID == "b" {
			return protocol.Result{Status: protocol.ResultFailed, Error: "disk full", ErrorClass: protocol.ClassPermanent}
		}
		return protocol.Result{Status: protocol.ResultSucceeded}
	})
	b.submit(t, []byte(diamond), "job-fail", "")
	job := b.waitJob(t, "job-fail", jobstore.JobFailed)
	steps, _ := b.store.Steps(context.Background(), job)
	want := map[string]jobstore.StepState{"a": jobstore.StepSucceeded, "b": jobstore.StepFailed, "c": jobstore.StepSucceeded, "d": jobstore.StepSkipped}
	for _, s := range steps {
		if s.State != want[s.ID] {
			t.Errorf("step %s is %s, want %s", s.ID, s.State, want[s.ID])
		}
	}
	if !strings.Contains(job.Error, "disk full") {
		t.Errorf("job error %q does not carry the step's", job.Error)
	}
}

func TestRetriableFailureIsRetriedWithNewEpoch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	agent := handagent.Start(t, b.js, "default", "a1", nil)
	agent.Reply(func(task protocol.Task) protocol.Result {
		if task.Attempt < 3 {
			return protocol.Result{Status: protocol.ResultFailed, Error: "connection refused"}
		}
		return protocol.Result{Status: protocol.ResultSucceeded}
	})
	b.submit(t, []byte("name: r\nsteps: [{id: s, action: echo, max_retries: 2}]"), "job-retry", "")
	b.waitJob(t, "job-retry", jobstore.JobSucceeded)
	st, _, _ := b.store.Step(context.Background(), "job-retry", "s")
	if st.Epoch != 3 || len(st.Attempts) != 3 || st.Attempts[0].Error != "connection refused" {
		b, _ := json.Marshal(st)
		t.Fatalf("retry chain wrong: %s", b)
	}
}

func TestStepNotStartedBeforeExpiryFailsAsExpired(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{WaitRetry: protocol.Duration(100 * time.Millisecond)})
	// Only an agent without the capability is present, so the step waits.
	handagent.Start(t, b.js, "default", "a1", nil)
	b.submit(t, []byte("name: e\nsteps: [{id: s, action: echo, requires: [gpu], expires_in: 300ms}]"), "job-expire", "")
	job := b.waitJob(t, "job-expire", jobstore.JobExpired)
	st, _, _ := b.store.Step(context.Background(), "job-expire", "s")
	if st.State != jobstore.StepExpired || !strings.HasPrefix(st.LastError, "expired") || st.Epoch != 0 {
		t.Fatalf("step %s epoch %d error %q", st.State, st.Epoch, st.LastError)
	}
	if !strings.Contains(job.Error, "expired") {
		t.Fatalf("job error %q", job.Error)
	}
	natstest.Eventually(t, 5*time.Second, "a step_expired event", func() bool {
		evs, err := events.List(context.Background(), b.js, protocol.EventStepExpired, 0)
		return err == nil && len(evs) == 1 && evs[0].StepID == "s"
	})
	t.Logf("step %s (%s), job %s, event step_expired", st.State, st.LastError, job.State)
}

// TestQuietPartitionKeepsItsOwner: with two schedulers running, every
// partition's pin stays with the scheduler that took it while nothing
// arrives. The server renews a pin only on a new pull request; pulling
// with the default 30 s expiry let quiet partitions flip between
// schedulers every pinned_ttl, and the new owner then read jobs the old
// one still acted on.
func TestQuietPartitionKeepsItsOwner(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	b := setup(t)
	cfg := scheduler.Config{Workers: 2, PinnedTTL: protocol.Duration(ttl)}
	b.startScheduler(t, cfg)
	b.startScheduler(t, cfg)
	ctx := context.Background()
	// A partition is pinned when it first delivers: one submission per
	// partition, each rejected at once (no steps), so that nothing
	// arrives afterwards.
	for p := range 8 {
		for i := 0; ; i++ {
			id := fmt.Sprintf("quiet-%d-%d", p, i)
			if protocol.Partition(id, 8) == p {
				b.submitNoReply(t, []byte(`{"name":"q","steps":[]}`), id)
				break
			}
		}
	}
	pins := func() map[string]string {
		out := map[string]string{}
		for p := range 8 {
			name := fmt.Sprintf("scheduler-submit-%d", p)
			c, err := b.js.Consumer(ctx, protocol.StreamSubmit, name)
			if err != nil {
				return nil
			}
			info, err := c.Info(ctx)
			if err != nil || len(info.PriorityGroups) == 0 || info.PriorityGroups[0].PinnedClientID == "" {
				return nil
			}
			out[name] = info.PriorityGroups[0].PinnedClientID
		}
		return out
	}
	var first map[string]string
	natstest.Eventually(t, 20*time.Second, "every partition pinned", func() bool {
		first = pins()
		return first != nil
	})
	// Watch for three TTLs with nothing arriving: no pin may change.
	until := time.Now().Add(3 * ttl)
	checks := 0
	for time.Now().Before(until) {
		now := pins()
		if now == nil {
			t.Fatal("a partition lost its pin while both schedulers ran")
		}
		for name, id := range first {
			if now[name] != id {
				t.Fatalf("partition %s changed owner while quiet (%s → %s)", name, id, now[name])
			}
		}
		checks++
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("8 submit partitions kept their owners for %s (%d checks), pinned_ttl %s", 3*ttl, checks, ttl)
}

// Another scheduler releasing concurrency slots publishes gate_freed at any
// moment, including while this one starts. Its subscription routed to the
// workers before they existed: a division by zero that killed the process.
func TestGateFreedWhileStartingIsHandled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sent atomic.Int64
	go func() {
		for ctx.Err() == nil {
			_ = b.nc.Publish(protocol.SubjectControlGateFreed, []byte("job-x"))
			sent.Add(1)
			time.Sleep(50 * time.Microsecond)
		}
	}()
	natstest.Eventually(t, 5*time.Second, "gate_freed flowing", func() bool { return sent.Load() > 100 })
	b.startScheduler(t, scheduler.Config{})
	b.submitNoReply(t, []byte(`{"name":"g","steps":[{"id":"s","action":"echo"}]}`), "job-g")
	handagent.Start(t, b.js, "default", "a1", nil)
	b.waitJob(t, "job-g", jobstore.JobSucceeded)
}

// noStartGrace turns off the wait for agents after the scheduler's start
// (selection.Config.StartGrace): a step whose action no agent offers fails
// at once as an unknown action.
func noStartGrace(cfg scheduler.Config) scheduler.Config {
	cfg.Selection = selection.DefaultConfig()
	cfg.Selection.StartGrace = -1
	return cfg
}

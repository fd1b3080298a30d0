package scheduler_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// A result for a step that the scheduler's cached copy of the job lacks
// (added since by the scheduler that owned the job while this one did not,
// e.g. a compensation step) is judged against the stored job, not
// rejected: rejected, the step waited for its lease (make chaos, a saga).
func TestResultForAStepAddedElsewhereIsApplied(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	ctx := context.Background()
	now := time.Now().UTC()
	sp := spec.Job{Name: "grows", Steps: []spec.Step{{ID: "a", Action: "noop"}, {ID: "b", Action: "noop"}}}
	storeRunningJob(t, b.store, "job-grows", sp, now)
	stepState := func(id string) jobstore.StepState {
		st, _, err := b.store.Step(ctx, "job-grows", id)
		if err != nil {
			return ""
		}
		return st.State
	}
	// The scheduler reads the job for a's result and keeps it (b runs on).
	b.publish(t, agentResult("job-grows", "a", now))
	natstest.Eventually(t, 10*time.Second, "a succeeded", func() bool { return stepState("a") == jobstore.StepSucceeded })

	// Meanwhile another scheduler adds step c and dispatches it.
	stored, rev, err := b.store.Job(ctx, "job-grows")
	if err != nil {
		t.Fatal(err)
	}
	stored.Spec.Steps = append(stored.Spec.Steps, spec.Step{ID: "c", Action: "noop"})
	if _, err := b.store.UpdateJob(ctx, stored, rev); err != nil {
		t.Fatal(err)
	}
	storeDispatched(t, b.store, "job-grows", stored.Spec.Steps[2:], now)

	// c's result reaches the scheduler that cached the job without c.
	b.publish(t, agentResult("job-grows", "c", now))
	natstest.Eventually(t, 10*time.Second, "c succeeded", func() bool { return stepState("c") == jobstore.StepSucceeded })
}

// publish stores m on its stream.
func (b *bundle) publish(t *testing.T, m *nats.Msg) {
	t.Helper()
	if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// A failure judged on a stale cached copy of the job (the step moved on
// elsewhere: the supervisor re-dispatched it at a new epoch) loses its
// compare-and-set, and the skips of the step's dependents it caused must
// not land without it. They were written in the same round as the step,
// landed, and the dependent went from skipped back to pending when the
// job was read again (watchers saw a terminal step reopen).
func TestSkipsOfAFailureThatLostItsWriteDoNotLand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	ctx := context.Background()
	now := time.Now().UTC()
	const id = "job-stale-skip"
	storeStaleCandidate(t, b, id, "noop")
	// Every state b's record takes (the bucket keeps only the latest).
	kv, err := b.js.KeyValue(ctx, protocol.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	watch, err := kv.Watch(ctx, protocol.StepKey(id, "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watch.Stop() }()
	var seen []string
	waited := false // b's record says what it waits for
	drain := func() {
		for {
			select {
			case e := <-watch.Updates():
				if e == nil {
					continue // the end of the initial values
				}
				var st jobstore.Step
				if err := json.Unmarshal(e.Value(), &st); err != nil {
					t.Fatal(err)
				}
				seen = append(seen, string(st.State))
				waited = waited || st.Waiting != ""
			default:
				return
			}
		}
	}

	// The scheduler reads the job for c's result and keeps it.
	b.publish(t, agentResult(id, "c", now))
	waitStep(t, b, id, "c", jobstore.StepSucceeded)
	// The supervisor moves a to another agent at epoch 2.
	moveToAgent2(t, b, id, "a")

	// agent-1's permanent failure at epoch 1 reaches the cached copy.
	b.publish(t, agentFailure(id, "a", now))
	// Read again, the result is stale: the scheduler records that.
	waitStaleResult(t, b, id)
	// agent-2's success at epoch 2 makes b ready; no agent is there to
	// take it, and the scheduler writes what it waits for. That turn comes
	// after the stale one, so once b's watch shows it every earlier state
	// of b's record has been seen.
	ok := protocol.Result{JobID: id, StepID: "a", Epoch: 2, Agent: "agent-2", Status: protocol.ResultSucceeded, StartedAt: now, FinishedAt: now}
	okMsg := nats.NewMsg(protocol.ResultSubject("default", "agent-2", id, "a"))
	okMsg.Data, _ = json.Marshal(ok)
	okMsg.Header.Set(protocol.HeaderMsgID, protocol.ResultMsgID(id, "a", 2, ""))
	b.publish(t, okMsg)
	natstest.Eventually(t, 10*time.Second, "b waiting for an agent", func() bool {
		drain()
		return waited
	})
	for _, s := range seen {
		if s != string(jobstore.StepPending) {
			t.Fatalf("b's record went through %v: a's failure lost its write, its skip of b must not land", seen)
		}
	}
}

// storeStaleCandidate stores job id, running: steps a and c dispatched to
// agent-1 at epoch 1, b (depending on a) pending; every step runs action.
func storeStaleCandidate(t *testing.T, b *bundle, id, action string) {
	t.Helper()
	now := time.Now().UTC()
	sp := spec.Job{Name: id, Steps: []spec.Step{
		{ID: "a", Action: action}, {ID: "c", Action: action}, {ID: "b", Action: action, DependsOn: []string{"a"}}}}
	job := jobstore.NewJob(id, sp, now)
	job.State = jobstore.JobRunning
	if _, err := b.store.CreateJob(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	storeDispatched(t, b.store, id, sp.Steps[:2], now)
	pending, err := jobstore.NewSteps(id, spec.Job{Steps: sp.Steps[2:]}, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.CreateStep(context.Background(), pending[0]); err != nil {
		t.Fatal(err)
	}
}

// moveToAgent2 does what the supervisor does to a step whose agent
// left: takes it back and dispatches it again, to agent-2 at epoch 2.
func moveToAgent2(t *testing.T, b *bundle, job, step string) {
	t.Helper()
	now := time.Now().UTC()
	b.editStep(t, job, step, func(st *jobstore.Step) {
		if err := st.Release("transferred", "agent-1 left", false, now); err != nil {
			t.Fatal(err)
		}
		if err := st.Dispatch("agent-2", "", now, time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	moved, _, err := b.store.Step(context.Background(), job, step)
	if err != nil || moved.Epoch != 2 {
		t.Fatalf("%s after the move: %+v, %v; want epoch 2", step, moved, err)
	}
}

// waitStaleResult waits for the scheduler's event of a stale result for
// job id.
func waitStaleResult(t *testing.T, b *bundle, id string) {
	t.Helper()
	ctx := context.Background()
	natstest.Eventually(t, 10*time.Second, "stale result event", func() bool {
		s, err := b.js.Stream(ctx, protocol.StreamEvents)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(protocol.EventSubject(protocol.EventStaleResult, id)))
		return err == nil && info.State.Msgs >= 1
	})
}

// agentSeen returns once the scheduler has dispatched a probe job to a
// mute agent: it knows the agent, and a ready step would go to it.
func agentSeen(t *testing.T, b *bundle) {
	t.Helper()
	id := "probe-" + t.Name()
	b.submitNoReply(t, []byte(`{"name":"probe","steps":[{"id":"s","action":"echo"}]}`), id)
	waitAllDispatched(t, b, id)
}

// A success judged on a stale cached copy must not dispatch the step's
// dependent: written beside the step's own write, which lost, the
// dispatch landed and b ran while a was still running elsewhere (and
// would have run had a then failed).
func TestDependentOfASuccessThatLostItsWriteIsNotDispatched(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	startMute(t, b, "mute-1")
	agentSeen(t, b)
	ctx := context.Background()
	const id = "job-stale-ok"
	storeStaleCandidate(t, b, id, "echo")
	now := time.Now().UTC()
	b.publish(t, agentResult(id, "c", now)) // the scheduler reads the job and keeps it
	waitStep(t, b, id, "c", jobstore.StepSucceeded)
	moveToAgent2(t, b, id, "a")
	b.publish(t, agentResult(id, "a", now)) // agent-1's success at epoch 1 meets the cached copy
	waitStaleResult(t, b, id)
	st, _, err := b.store.Step(ctx, id, "b")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != jobstore.StepPending {
		t.Fatalf("b is %s (on %s) while a runs at epoch 2: a's success lost its write, b must wait", st.State, st.Actor)
	}
}

// An undo step must not be created, let alone dispatched, when the job
// record that starts its compensation does not land. Created beside the
// step failure, before the job record, it was dispatched and ran for a job
// that ended cancelled with nothing undone (an operator's cancel had
// written the job record meanwhile), and its record stayed for ever.
func TestUndoIsNotCreatedWhenItsCompensationDidNotStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	startMute(t, b, "mute-1")
	agentSeen(t, b)
	tasks := watchTasks(t, b)
	ctx := context.Background()
	now := time.Now().UTC()
	const id = "job-undo-lost"
	sp := spec.Job{Name: "undo-lost", Steps: []spec.Step{
		{ID: "a", Action: "echo", Compensate: &spec.Compensation{Action: "echo"}}, {ID: "x", Action: "echo"}}}
	storeRunningJob(t, b.store, id, sp, now)
	b.publish(t, agentResult(id, "a", now))
	waitStep(t, b, id, "a", jobstore.StepSucceeded)
	// An operator's cancel has written the job record; its advance is
	// not here yet.
	b.editJob(t, id, func(j *jobstore.Job) { j.Desired, j.UpdatedAt = jobstore.JobCancelled, time.Now().UTC() })
	b.publish(t, agentFailure(id, "x", now))
	j := b.waitJob(t, id, jobstore.JobCancelled)
	tasks.drain(t, 200*time.Millisecond)
	undo := spec.CompensationID("a")
	if n := tasks.byID[protocol.TaskMsgID(id, undo, 1)]; n > 0 {
		t.Fatalf("job ended %s with %d steps in its spec, but %s's task was published %d times", j.State, len(j.Spec.Steps), undo, n)
	}
	if st, _, err := b.store.Step(ctx, id, undo); !errors.Is(err, jobstore.ErrNotFound) {
		t.Fatalf("%s has a record (%+v, %v) in a job that never compensated", undo, st, err)
	}
}

// A job that ends in the turn that creates it (its first step's action is
// one no agent offers) is created before its steps, and its terminal
// record lands after theirs: it is the completion signal.
func TestJobEndingAtItsCreationEndsAfterItsSteps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, noStartGrace(scheduler.Config{})) // "nope" fails at once
	startMute(t, b, "mute-1")
	agentSeen(t, b)
	ctx := context.Background()
	kv, err := b.js.KeyValue(ctx, protocol.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	const id = "job-born-failed"
	watch, err := kv.WatchFiltered(ctx, []string{protocol.JobKey(id), protocol.StepKeysFilter(id)}, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watch.Stop() }()
	b.submitNoReply(t, []byte(`{"name":"born-failed","steps":[{"id":"a","action":"nope"},{"id":"b","action":"echo","depends_on":["a"]}]}`), id)
	var seen []string
	deadline := time.After(10 * time.Second)
	for {
		var e jetstream.KeyValueEntry
		select {
		case e = <-watch.Updates():
		case <-deadline:
			t.Fatalf("no terminal job record within 10s; seen %v", seen)
		}
		var rec struct {
			State string `json:"state"`
		}
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatal(err)
		}
		seen = append(seen, e.Key()+"="+rec.State)
		if e.Key() != protocol.JobKey(id) || !jobstore.JobState(rec.State).Terminal() {
			continue
		}
		if rec.State != string(jobstore.JobFailed) {
			t.Fatalf("job ended %s, want failed: %v", rec.State, seen)
		}
		for _, k := range []string{protocol.StepKey(id, "a"), protocol.StepKey(id, "b")} {
			if !slices.ContainsFunc(seen, func(s string) bool { return strings.HasPrefix(s, k+"=") }) {
				t.Fatalf("the job's terminal record landed before %s's: %v", k, seen)
			}
		}
		if seen[0] != protocol.JobKey(id)+"=pending" && seen[0] != protocol.JobKey(id)+"=running" {
			t.Fatalf("the job record was not created first: %v", seen)
		}
		return
	}
}

// An event reports a write that landed even when a later write of the
// same turn did not: the retry finds the change made and does not report
// it again. Here the job record that starts a compensation lands and the
// undo step's creation does not (a record of it is there already, which
// the scheduler's copy does not know): job_compensating was never sent.
func TestEventOfAWriteThatLandedIsSentWhenALaterOneLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	ctx := context.Background()
	now := time.Now().UTC()
	const id = "job-event-kept"
	sp := spec.Job{Name: "event-kept", Steps: []spec.Step{
		{ID: "a", Action: "noop", Compensate: &spec.Compensation{Action: "noop"}}, {ID: "x", Action: "noop"}}}
	storeRunningJob(t, b.store, id, sp, now)
	b.publish(t, agentResult(id, "a", now)) // the scheduler reads the job and keeps it
	waitStep(t, b, id, "a", jobstore.StepSucceeded)
	undo, _ := sp.Steps[0].CompensationStep()
	recs, err := jobstore.NewSteps(id, spec.Job{Steps: []spec.Step{undo}}, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.CreateStep(ctx, recs[0]); err != nil {
		t.Fatal(err)
	}
	b.publish(t, agentFailure(id, "x", now))
	b.waitJob(t, id, jobstore.JobCompensating)
	natstest.Eventually(t, 10*time.Second, "a job_compensating event", func() bool {
		s, err := b.js.Stream(ctx, protocol.StreamEvents)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(protocol.EventSubject(protocol.EventJobCompensating, id)))
		return err == nil && info.State.Msgs == 1
	})
}

// agentFailure is agent-1's permanent failure of a step dispatched by
// storeDispatched.
func agentFailure(job, step string, now time.Time) *nats.Msg {
	m := agentResult(job, step, now)
	r := protocol.Result{JobID: job, StepID: step, Epoch: 1, Agent: "agent-1", Status: protocol.ResultFailed,
		Error: "boom", ErrorClass: protocol.ClassPermanent, StartedAt: now, FinishedAt: now}
	m.Data, _ = json.Marshal(r)
	return m
}

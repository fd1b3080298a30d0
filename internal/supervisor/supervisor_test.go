package supervisor_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
	"github.com/wardenhq/warden/test/handagent"
)

type bundle struct {
	srv   *natstest.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	store *jobstore.Store
}

func setup(t *testing.T, sched scheduler.Config, sup supervisor.Config) *bundle {
	t.Helper()
	srv, nc, js := natstest.Start(t, streams.Options{})
	store, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{srv: srv, nc: nc, js: js, store: store}
	b.scheduler(t, sched)
	b.supervisor(t, sup)
	return b
}

// tasksIn counts the tasks a task stream holds: its messages on task
// subjects, without the anchor the leader keeps there.
func tasksIn(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(protocol.SubjectTaskPrefix+".>"))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

func testLogger(t *testing.T, component string) zerolog.Logger {
	if !testing.Verbose() {
		return zerolog.Nop()
	}
	return zerolog.New(zerolog.NewTestWriter(t)).With().Str("component", component).Logger()
}

// run runs f until the returned stop is called or the test ends; stop
// waits for f to return.
func run(t *testing.T, name string, f func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: %v", name, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// scheduler starts a scheduler on its own connection.
func (b *bundle) scheduler(t *testing.T, cfg scheduler.Config) (stop func()) {
	t.Helper()
	snc, _ := b.srv.Connect(t)
	s, err := scheduler.New(cfg, snc, scheduler.WithLogger(testLogger(t, "scheduler")))
	if err != nil {
		t.Fatal(err)
	}
	return run(t, "scheduler", s.Run)
}

// supervisor starts a supervisor on its own connection.
func (b *bundle) supervisor(t *testing.T, cfg supervisor.Config) *supervisor.Supervisor {
	t.Helper()
	vnc, _ := b.srv.Connect(t)
	v, err := supervisor.New(cfg, vnc, testLogger(t, "supervisor"), nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, "supervisor", v.Run)
	return v
}

func (b *bundle) submit(t *testing.T, id, body string) {
	t.Helper()
	msg := nats.NewMsg(protocol.SubjectSubmit)
	msg.Data = []byte(body)
	msg.Header.Set(protocol.HeaderJobID, id)
	if _, err := b.js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) step(t *testing.T, job, step string) *jobstore.Step {
	t.Helper()
	st, _, err := b.store.Step(context.Background(), job, step)
	if err != nil {
		return nil
	}
	return st
}

func (b *bundle) events(t *testing.T, kind protocol.EventKind) []protocol.Event {
	t.Helper()
	evs, err := events.List(context.Background(), b.js, kind, 0)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func TestExpiredLeaseIsRedispatchedWithNewEpoch(t *testing.T) {
	t.Parallel()
	b := setup(t,
		scheduler.Config{DispatchGrace: protocol.Duration(200 * time.Millisecond)},
		supervisor.Config{FailureThreshold: protocol.Duration(time.Hour), RecoveryGrace: protocol.Duration(time.Second)})
	sink := handagent.Start(t, b.js, "default", "sink", []string{"x"})
	// Registered after the agent, so it runs before the agent's cleanup.
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	sink.Reply(func(protocol.Task) protocol.Result { <-hold; return protocol.Result{Status: handagent.Drop} })
	b.submit(t, "job-lease", "name: l\nsteps: [{id: s, action: echo, requires: [x], timeout: 1s}]")
	natstest.Eventually(t, 10*time.Second, "sink got the task", func() bool { return len(sink.Received()) == 1 })
	// The sink goes silent; a healthy agent joins. Failover is off (1h
	// threshold), so only the lease can bring the step back.
	sink.Leave()
	handagent.Start(t, b.js, "default", "good", []string{"x"})
	natstest.Eventually(t, 15*time.Second, "step succeeds elsewhere", func() bool {
		st := b.step(t, "job-lease", "s")
		return st != nil && st.State == jobstore.StepSucceeded
	})
	st := b.step(t, "job-lease", "s")
	if st.Epoch != 2 || st.Actor != "good" || st.Attempts[0].Status != "lease_expired" || st.Attempts[0].Agent != "sink" {
		raw, _ := json.Marshal(st)
		t.Fatalf("recovery not recorded as expected: %s", raw)
	}
}

func TestFailedAgentsTasksAreTransferred(t *testing.T) {
	t.Parallel()
	b := setup(t, scheduler.Config{}, supervisor.Config{FailureThreshold: protocol.Duration(300 * time.Millisecond)})
	sink := handagent.Start(t, b.js, "default", "sink", []string{"x"})
	// Registered after the agent, so it runs before the agent's cleanup.
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	sink.Reply(func(protocol.Task) protocol.Result { <-hold; return protocol.Result{Status: handagent.Drop} })
	b.submit(t, "job-fo-1", "name: f\nsteps: [{id: s, action: echo, requires: [x]}]")
	b.submit(t, "job-fo-2", "name: f\nsteps: [{id: s, action: echo, requires: [x]}]")
	natstest.Eventually(t, 10*time.Second, "both dispatched to sink", func() bool {
		a, c := b.step(t, "job-fo-1", "s"), b.step(t, "job-fo-2", "s")
		return a != nil && c != nil && a.Actor == "sink" && c.Actor == "sink"
	})
	// The sink holds the first task it got in its handler (delivered,
	// unacked); the other was delivered in the same fetch or still queued.
	natstest.Eventually(t, 10*time.Second, "sink holds a task", func() bool { return len(sink.Received()) >= 1 })
	t.Logf("sink received %d", len(sink.Received()))
	handagent.Start(t, b.js, "default", "good", []string{"x"})
	sink.Stop() // a crash: no clean delete, the presence expires by TTL
	natstest.Eventually(t, 15*time.Second, "both steps succeed on good", func() bool {
		for _, j := range []string{"job-fo-1", "job-fo-2"} {
			st := b.step(t, j, "s")
			if st == nil || st.State != jobstore.StepSucceeded {
				return false
			}
		}
		return true
	})
	inHand := 0
	for _, j := range []string{"job-fo-1", "job-fo-2"} {
		st := b.step(t, j, "s")
		// A task the sink had been given counts towards the poison
		// threshold; one still queued did nothing wrong.
		if st.Actor != "good" || st.TransferredFrom != "sink" || st.Attempts[0].Status != "transferred" || st.Recoveries > 1 {
			raw, _ := json.Marshal(st)
			t.Errorf("transfer not recorded: %s", raw)
		}
		inHand += st.Recoveries
	}
	if inHand == 0 {
		t.Errorf("the task the sink held did not count as a recovery")
	}
	var moved int
	natstest.Eventually(t, 5*time.Second, "failover event", func() bool {
		moved = 0
		for _, e := range b.events(t, "failover") {
			// The outcome is a snapshot taken right after the advance
			// request: a pipelined scheduler may not have written the new
			// dispatch yet (no_target, waiting). Where the steps went is
			// asserted above.
			if e.Agent == "sink" && (e.Data["outcome"] == supervisor.OutcomeTransferred || e.Data["outcome"] == supervisor.OutcomeNoTarget) {
				moved += atoi(e.Data["tasks_moved"])
			}
		}
		return moved == 2
	})
}

func TestMaxDeliveriesDeadLetterTheTask(t *testing.T) {
	t.Parallel()
	b := setup(t, scheduler.Config{}, supervisor.Config{})
	crashy := handagent.Start(t, b.js, "default", "crashy", nil, handagent.Options{AckWait: 100 * time.Millisecond, MaxDeliver: 3})
	crashy.Reply(func(protocol.Task) protocol.Result {
		return protocol.Result{Status: handagent.Drop, Error: "segfault"}
	})
	b.submit(t, "job-poison", "name: p\nsteps: [{id: s, action: echo}, {id: after, action: echo, depends_on: [s]}]")
	natstest.Eventually(t, 20*time.Second, "job fails with a dead-lettered step", func() bool {
		j, _, err := b.store.Job(context.Background(), "job-poison")
		return err == nil && j.State == jobstore.JobFailed
	})
	st := b.step(t, "job-poison", "s")
	if st.State != jobstore.StepDeadLettered || !strings.Contains(st.LastError, "delivered 3 times") {
		t.Fatalf("step %s: %s", st.State, st.LastError)
	}
	if after := b.step(t, "job-poison", "after"); after.State != jobstore.StepSkipped {
		t.Fatalf("dependent is %s", after.State)
	}
	s, _ := b.js.Stream(context.Background(), protocol.StreamDLQ)
	raw, err := s.GetLastMsgForSubject(context.Background(), protocol.DLQSubject("default", "crashy"))
	if err != nil {
		t.Fatal(err)
	}
	var task protocol.Task
	if err := json.Unmarshal(raw.Data, &task); err != nil || task.JobID != "job-poison" || task.StepID != "s" {
		t.Fatalf("dead letter payload %q: %v", raw.Data, err)
	}
	if raw.Header.Get(protocol.HeaderDLQReason) != "max_deliveries" || raw.Header.Get(protocol.HeaderDLQDeliveries) != "3" ||
		raw.Header.Get(protocol.HeaderJob) != "job-poison" {
		t.Fatalf("dead letter headers %v", raw.Header)
	}
	// The original is gone from the task stream.
	if n := tasksIn(t, b.js, protocol.TaskStream(protocol.Shard("default", "crashy", streams.DefaultTaskShards))); n != 0 {
		t.Fatalf("%d tasks left in the task stream", n)
	}

	// The operator fixes the cause and retries the dead letter.
	crashy.Reply(nil)
	q, err := dlq.Open(context.Background(), b.nc, b.js)
	if err != nil {
		t.Fatal(err)
	}
	letters, err := q.List(context.Background(), 0)
	if err != nil || len(letters) != 1 || letters[0].StepID != "s" || letters[0].Reason != "max_deliveries" {
		t.Fatalf("dlq list: %+v %v", letters, err)
	}
	if _, err := q.Retry(context.Background(), b.store, letters[0].ID); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 20*time.Second, "retried job succeeds", func() bool {
		j, _, err := b.store.Job(context.Background(), "job-poison")
		return err == nil && j.State == jobstore.JobSucceeded
	})
	if st := b.step(t, "job-poison", "s"); st.Epoch != 2 || st.Attempt != 1 {
		t.Fatalf("retried step epoch %d attempt %d", st.Epoch, st.Attempt)
	}
	if left, _ := q.List(context.Background(), 0); len(left) != 0 {
		t.Fatalf("dead letter not removed after retry: %+v", left)
	}
	if _, err := q.Retry(context.Background(), b.store, letters[0].ID); !errors.Is(err, dlq.ErrNotFound) {
		t.Fatalf("second retry of the same letter: %v", err)
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

func TestSelfHealingDeprioritisesThenDrains(t *testing.T) {
	t.Parallel()
	b := setup(t, scheduler.Config{}, supervisor.Config{SelfHealing: true, CycleInterval: protocol.Duration(200 * time.Millisecond)})
	sick := handagent.Start(t, b.js, "default", "sick", nil)
	handagent.Start(t, b.js, "default", "fine", nil)
	healing := func() []string {
		var out []string
		for _, e := range b.events(t, "healing") {
			if e.Agent == "sick" {
				out = append(out, e.Data["action"]+"/"+e.Data["level"])
			}
		}
		return out
	}
	// Three failures in a row: degraded, so deprioritised.
	sick.Report(0, 3)
	natstest.Eventually(t, 10*time.Second, "deprioritised", func() bool {
		h := healing()
		return len(h) > 0 && h[len(h)-1] == "deprioritise/degraded"
	})
	// Ten more: past the unhealthy thresholds, so critical and drained.
	sick.Report(0, 13)
	natstest.Eventually(t, 10*time.Second, "drained", func() bool {
		h := healing()
		return len(h) > 0 && h[len(h)-1] == "drain/critical"
	})
	if got := sick.Orders(); len(got) == 0 || got[len(got)-1] != protocol.ControlDrain {
		t.Fatalf("agent received %v, want a drain", got)
	}
	t.Logf("healing history of sick: %v", healing())
	// It recovers: successes push the failure rate down, healing undoes the drain.
	sick.Report(200, 13)
	natstest.Eventually(t, 15*time.Second, "restored", func() bool {
		h := healing()
		if len(h) == 0 {
			return false
		}
		last := h[len(h)-1]
		return strings.HasPrefix(last, "restore/") || strings.HasPrefix(last, "deprioritise/")
	})
	if got := sick.Orders(); got[len(got)-1] != protocol.ControlUndrain {
		t.Fatalf("agent received %v, want an undrain last", got)
	}
	t.Logf("after recovery: %v, orders %v", healing(), sick.Orders())
}

// The supervisor never dispatches: with no scheduler running, a step whose
// lease expired is released (pending, the expiry in its retry chain) and
// stays there, its advance asked for again and again, until a scheduler
// answers and dispatches it with a new epoch.
func TestReleasedStepWaitsForASchedulerToAdvanceIt(t *testing.T) {
	t.Parallel()
	srv, nc, js := natstest.Start(t, streams.Options{})
	store, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{srv: srv, nc: nc, js: js, store: store}
	stopScheduler := b.scheduler(t, scheduler.Config{DispatchGrace: protocol.Duration(200 * time.Millisecond)})
	b.supervisor(t, supervisor.Config{FailureThreshold: protocol.Duration(time.Hour), RecoveryRetry: protocol.Duration(200 * time.Millisecond)})
	sink := handagent.Start(t, js, "default", "sink", []string{"x"})
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	sink.Reply(func(protocol.Task) protocol.Result { <-hold; return protocol.Result{Status: handagent.Drop} })
	b.submit(t, "job-nosched", "name: n\nsteps: [{id: s, action: echo, requires: [x], timeout: 2s}]")
	natstest.Eventually(t, 10*time.Second, "sink got the task", func() bool { return len(sink.Received()) == 1 })
	stopScheduler()
	sink.Leave()
	handagent.Start(t, js, "default", "good", []string{"x"})
	natstest.Eventually(t, 15*time.Second, "step released after its lease", func() bool {
		st := b.step(t, "job-nosched", "s")
		return st != nil && st.State == jobstore.StepPending && len(st.Attempts) == 1 && st.Attempts[0].Status == "lease_expired"
	})
	// Nobody dispatches it meanwhile: no scheduler, and the supervisor
	// never publishes tasks.
	if n := tasksIn(t, js, protocol.TaskStream(protocol.Shard("default", "good", streams.DefaultTaskShards))); n != 0 {
		t.Fatalf("%d tasks published with no scheduler running", n)
	}
	if st := b.step(t, "job-nosched", "s"); st.State != jobstore.StepPending || st.Epoch != 1 {
		t.Fatalf("step %s at epoch %d while no scheduler runs", st.State, st.Epoch)
	}
	b.scheduler(t, scheduler.Config{})
	natstest.Eventually(t, 15*time.Second, "a new scheduler dispatches it, asked by the supervisor", func() bool {
		st := b.step(t, "job-nosched", "s")
		return st != nil && st.State == jobstore.StepSucceeded
	})
	st := b.step(t, "job-nosched", "s")
	t.Logf("step %s on %s at epoch %d; chain %+v", st.State, st.Actor, st.Epoch, st.Attempts)
	if st.Epoch != 2 || st.Actor != "good" {
		t.Fatalf("step on %s at epoch %d, want good at epoch 2", st.Actor, st.Epoch)
	}
}

package dlq_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// live is a server with a scheduler and a supervisor, each on its own
// connection, running until the test ends.
func live(t *testing.T) (*natstest.Server, *bundle) {
	t.Helper()
	srv, nc, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	q, err := dlq.Open(ctx, nc, js)
	if err != nil {
		t.Fatal(err)
	}
	snc, _ := srv.Connect(t)
	s, err := scheduler.New(scheduler.Config{}, snc, scheduler.WithLogger(zerolog.Nop()))
	if err != nil {
		t.Fatal(err)
	}
	runUntilEnd(t, "scheduler", s.Run)
	vnc, _ := srv.Connect(t)
	v, err := supervisor.New(supervisor.Config{}, vnc, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	runUntilEnd(t, "supervisor", v.Run)
	return srv, &bundle{nc: nc, js: js, store: store, q: q}
}

func runUntilEnd(t *testing.T, name string, f func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: %v", name, err)
		}
	})
}

// A dead-letter retry reopened its step and set the job's desired state
// back to succeeded, whatever it was: retried while the job was being
// cancelled (step a dead-lettered, step b running, `warden job cancel`),
// it undid the cancel, ran a again after it and could end the job
// succeeded; retried once the job had ended cancelled, it brought the job
// back to running. Both are refused now (a conflict naming the cancel);
// the job ends cancelled, a is not dispatched again, and the letter stays.
// Running the cancelled job again is asked for explicitly: a job retry.
func TestRetryOfALetterDoesNotUndoACancel(t *testing.T) {
	t.Parallel()
	_, b := live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	var (
		mu     sync.Mutex
		healed bool // a no longer crashes its agent
	)
	// a is pinned to crashy (a redelivered task waits to run alone on its
	// agent), b needs the capability "hold", which holder has.
	script := func(ctx context.Context, task *agent.Task) (any, error) {
		mu.Lock()
		ok := healed
		mu.Unlock()
		switch {
		case ok:
			return map[string]string{"step": task.StepID}, nil
		case task.StepID == "a":
			return nil, agenttest.ErrDrop // a poison task: dead-lettered after 3 deliveries
		default:
			<-ctx.Done() // b runs until its agent crashes
			return nil, ctx.Err()
		}
	}
	start := func(name string, caps ...string) *agenttest.Agent {
		a := agenttest.StartAgent(t, b.nc, agent.Config{ID: name, Pool: "default", Capabilities: caps, MaxConcurrent: 8,
			Lease: protocol.Duration(300 * time.Millisecond), MaxDeliver: 3})
		a.Script(script)
		return a
	}
	start("crashy")
	holder := start("holder", "hold")
	const id = "job-cancel-retry"
	m := nats.NewMsg(protocol.SubjectSubmit)
	m.Data = []byte("name: c\nsteps: [{id: a, action: echo, agent: crashy}, {id: b, action: echo, requires: [hold], timeout: 20s}]")
	m.Header.Set(protocol.HeaderJobID, id)
	if _, err := b.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	step := func(s string) *jobstore.Step {
		st, _, err := b.store.Step(ctx, id, s)
		if err != nil {
			return &jobstore.Step{}
		}
		return st
	}
	natstest.Eventually(t, 30*time.Second, "a dead-lettered while b runs", func() bool {
		return step("a").State == jobstore.StepDeadLettered && step("b").State == jobstore.StepDispatched
	})
	var letter dlq.Letter
	natstest.Eventually(t, 10*time.Second, "a's dead letter", func() bool {
		ls, err := b.q.List(ctx, 0)
		for _, l := range ls {
			if l.JobID == id && l.StepID == "a" {
				letter = l
			}
		}
		return err == nil && letter.ID != 0
	})
	aEpoch := step("a").Epoch

	// b's agent crashes: b stays running, cancel or not, until its lease
	// ends (an agent told to stop reports within a second).
	holder.Stop()
	o := ops.New(b.nc, b.store)
	rep, err := o.CancelJob(ctx, id)
	if err != nil || len(rep.Interrupted) != 1 || rep.Interrupted[0] != "b" {
		t.Fatalf("cancel: %+v %v", rep, err)
	}
	// Being cancelled: b still runs.
	_, err = b.q.Retry(ctx, b.store, letter.ID)
	var jce *dlq.JobCancelledError
	if !errors.As(err, &jce) || jce.Job != id || jce.State.Terminal() || !errors.Is(err, dlq.ErrJobCancelled) ||
		!errors.Is(err, dlq.ErrWrongState) || ops.CodeOf(err) != ops.CodeConflict {
		t.Errorf("dlq retry of a letter of a job being cancelled: %v (%T)", err, err)
	} else {
		t.Logf("refused while cancelling: %v (code %s, exit %d)", err, ops.CodeOf(err), ops.CodeOf(err).ExitCode())
	}
	if j, _, err := b.store.Job(ctx, id); err != nil {
		t.Fatal(err)
	} else if j.Desired != jobstore.JobCancelled {
		t.Errorf("job after the retry: desired %s, want cancelled", j.Desired)
	}
	// The operator moves the crashed agent's tasks now rather than at
	// the end of b's lease: b, cancelled, ends so.
	if _, err := o.FailoverAgent(ctx, "default", "holder"); err != nil {
		t.Fatalf("failover of the crashed agent: %v", err)
	}
	final, err := o.WaitJob(ctx, id, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if final.State != jobstore.JobCancelled {
		t.Fatalf("job ended %s, want cancelled", final.State)
	}
	if st := step("a"); st.State != jobstore.StepDeadLettered || st.Epoch != aEpoch {
		t.Fatalf("a after the cancel: %s epoch %d (was %d): dispatched again", st.State, st.Epoch, aEpoch)
	}

	// Ended cancelled: a dead-letter retry does not bring it back either.
	_, err = b.q.Retry(ctx, b.store, letter.ID)
	if !errors.As(err, &jce) || !jce.State.Terminal() || ops.CodeOf(err) != ops.CodeConflict {
		t.Fatalf("dlq retry of a letter of a cancelled job: %v", err)
	}
	t.Logf("refused once cancelled: %v", err)
	if j, _, err := b.store.Job(ctx, id); err != nil || j.State != jobstore.JobCancelled {
		t.Fatalf("cancelled job after a refused retry: %+v %v", j, err)
	}
	if _, err := b.q.Get(ctx, letter.ID); err != nil {
		t.Fatalf("letter gone after refused retries: %v", err)
	}

	// Asked for explicitly, the job runs again: a job retry.
	mu.Lock()
	healed = true
	mu.Unlock()
	start("holder-2", "hold")
	reopened, err := o.RetryJob(ctx, id)
	if err != nil || len(reopened) != 2 {
		t.Fatalf("job retry of the cancelled job: %v %v", reopened, err)
	}
	if final, err := o.WaitJob(ctx, id, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	} else if final.State != jobstore.JobSucceeded {
		t.Fatalf("retried job ended %s, want succeeded", final.State)
	}
}

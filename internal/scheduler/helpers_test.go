package scheduler_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

type bundle struct {
	srv   *natstest.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	store *jobstore.Store
}

func setup(t *testing.T) *bundle {
	t.Helper()
	srv, nc, js := natstest.Start(t, streams.Options{})
	store, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{srv: srv, nc: nc, js: js, store: store}
}

// startScheduler runs a scheduler on its own connection until the test ends.
func (b *bundle) startScheduler(t *testing.T, cfg scheduler.Config, opts ...scheduler.Option) {
	t.Helper()
	nc, _ := b.srv.Connect(t)
	b.startSchedulerOn(t, nc, cfg, opts...)
}

// startSchedulerOn runs a scheduler on nc until the test ends, which fails
// if Run returns an error.
func (b *bundle) startSchedulerOn(t *testing.T, nc *nats.Conn, cfg scheduler.Config, opts ...scheduler.Option) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := runScheduler(ctx, t, nc, cfg, opts...)
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("scheduler: %v", err)
		}
	})
}

// runScheduler runs a scheduler on nc until ctx ends; the channel gets
// what Run returned.
func runScheduler(ctx context.Context, t *testing.T, nc *nats.Conn, cfg scheduler.Config, opts ...scheduler.Option) <-chan error {
	t.Helper()
	s, err := scheduler.New(cfg, nc, append([]scheduler.Option{scheduler.WithLogger(testLogger(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	return done
}

// submit publishes a spec with headers and returns the scheduler's reply.
func (b *bundle) submit(t *testing.T, body []byte, jobID, msgID string) protocol.SubmitReply {
	t.Helper()
	headers := map[string]string{}
	if jobID != "" {
		headers[protocol.HeaderJobID] = jobID
	}
	if msgID != "" {
		headers[protocol.HeaderMsgID] = msgID
	}
	return b.submitOn(t, protocol.SubjectSubmit, body, headers)
}

// submitOn publishes a spec on subject with headers and returns the
// scheduler's reply.
func (b *bundle) submitOn(t *testing.T, subject string, body []byte, headers map[string]string) protocol.SubmitReply {
	t.Helper()
	inbox := nats.NewInbox()
	sub, err := b.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	msg := nats.NewMsg(subject)
	msg.Data = body
	for k, v := range headers {
		msg.Header.Set(k, v)
	}
	msg.Header.Set(protocol.HeaderReplyTo, inbox)
	if _, err := b.js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no submission reply: %v", err)
	}
	var r protocol.SubmitReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func (b *bundle) waitJob(t *testing.T, id string, want jobstore.JobState) *jobstore.Job {
	t.Helper()
	var job *jobstore.Job
	natstest.Eventually(t, 20*time.Second, "job "+id+" "+string(want), func() bool {
		j, _, err := b.store.Job(context.Background(), id)
		if err != nil {
			return false
		}
		job = j
		return j.State == want
	})
	return job
}

// lastSeq counts the messages a stream has stored so far (work-queue
// streams delete acked ones, so Msgs would not).
func lastSeq(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

func testLogger(t *testing.T) zerolog.Logger {
	if !testing.Verbose() {
		return zerolog.Nop()
	}
	return zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger()
}

// submitNoReply submits a spec on the job's own subject, as pkg/client does,
// and waits only for the PubAck (the durable acceptance).
func (b *bundle) submitNoReply(t *testing.T, body []byte, jobID string) {
	t.Helper()
	msg := nats.NewMsg(protocol.SubmitSubject(jobID))
	msg.Data = body
	if _, err := b.js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
}

// storeRunningJob writes job id, running, with every step of sp
// dispatched (storeDispatched).
func storeRunningJob(tb testing.TB, store *jobstore.Store, id string, sp spec.Job, now time.Time) {
	tb.Helper()
	job := jobstore.NewJob(id, sp, now)
	job.State = jobstore.JobRunning
	if _, err := store.CreateJob(context.Background(), job); err != nil {
		tb.Fatal(err)
	}
	storeDispatched(tb, store, id, sp.Steps, now)
}

// storeDispatched writes steps of job jobID to the store as a scheduler
// other than the one under test would have: dispatched to agent-1 at
// epoch 1, without a lease token.
func storeDispatched(tb testing.TB, store *jobstore.Store, jobID string, steps []spec.Step, now time.Time) {
	tb.Helper()
	sts, err := jobstore.NewSteps(jobID, spec.Job{Name: jobID, Steps: steps}, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		tb.Fatal(err)
	}
	for _, st := range sts {
		_ = st.Dispatch("agent-1", "", now, time.Hour)
		if _, err := store.CreateStep(context.Background(), st); err != nil {
			tb.Fatal(err)
		}
	}
}

// agentResult is agent-1's succeeded result for a step dispatched by
// storeDispatched.
func agentResult(job, step string, now time.Time) *nats.Msg {
	r := protocol.Result{JobID: job, StepID: step, Epoch: 1, Agent: "agent-1", Status: protocol.ResultSucceeded, StartedAt: now, FinishedAt: now}
	body, _ := json.Marshal(r)
	m := nats.NewMsg(protocol.ResultSubject("default", "agent-1", job, step))
	m.Data = body
	m.Header.Set(protocol.HeaderMsgID, protocol.ResultMsgID(job, step, 1, ""))
	return m
}

// editJob changes job id's record with edit, at the revision it read.
func (b *bundle) editJob(t *testing.T, id string, edit func(*jobstore.Job)) {
	t.Helper()
	j, rev, err := b.store.Job(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	edit(j)
	if _, err := b.store.UpdateJob(context.Background(), j, rev); err != nil {
		t.Fatal(err)
	}
}

// editStep changes the record of step id of job with edit, at the revision
// it read.
func (b *bundle) editStep(t *testing.T, job, id string, edit func(*jobstore.Step)) {
	t.Helper()
	st, rev, err := b.store.Step(context.Background(), job, id)
	if err != nil {
		t.Fatal(err)
	}
	edit(st)
	if _, err := b.store.UpdateStep(context.Background(), st, rev); err != nil {
		t.Fatal(err)
	}
}

// waitStep waits until step of job is in state and returns its record.
func waitStep(t *testing.T, b *bundle, job, step string, state jobstore.StepState) *jobstore.Step {
	t.Helper()
	var st *jobstore.Step
	natstest.Eventually(t, 15*time.Second, job+"."+step+" "+string(state), func() bool {
		var err error
		st, _, err = b.store.Step(context.Background(), job, step)
		return err == nil && st.State == state
	})
	return st
}

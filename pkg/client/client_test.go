package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

const diamond = `
name: deploy
steps:
  - {id: fetch, action: echo}
  - {id: test, action: echo, depends_on: [fetch]}
  - {id: lint, action: echo, depends_on: [fetch]}
  - {id: release, action: echo, depends_on: [test, lint]}
`

type bundle struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	client *client.Client
	store  *jobstore.Store
}

func setup(t *testing.T) bundle {
	t.Helper()
	_, nc, js := natstest.Start(t, streams.Options{TaskShards: 1})
	st, err := jobstore.Open(ctx(t), js)
	if err != nil {
		t.Fatal(err)
	}
	return bundle{nc: nc, js: js, client: client.New(js, client.Options{ReplyTimeout: 200 * time.Millisecond}), store: st}
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func submitted(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	s, err := js.Stream(ctx(t), protocol.StreamSubmit)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func TestSubmitInvalidSpecPublishesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cyclic := "name: x\nsteps:\n- {id: a, action: echo, depends_on: [b]}\n- {id: b, action: echo, depends_on: [a]}\n"
	_, err := b.client.Submit(ctx(t), []byte(cyclic), client.SubmitOptions{})
	if !errors.Is(err, spec.ErrInvalid) || spec.ReasonOf(err) != spec.ReasonCycle {
		t.Fatalf("got %v, want a cycle validation error", err)
	}
	if n := submitted(t, b.js); n != 0 {
		t.Fatalf("%d submissions stored, want 0", n)
	}
}

func TestSubmitIdempotencyKeyTwiceIsOneJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	withKey := []byte("idempotency_key: release-7\n" + diamond)
	first, err := b.client.Submit(ctx(t), withKey, client.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if first.JobID != protocol.JobIDForKey("release-7") || first.Existing {
		t.Fatalf("first receipt %+v", first)
	}
	if first.Confirmed {
		t.Fatalf("no scheduler runs, yet the submission is confirmed: %+v", first)
	}
	second, err := b.client.Submit(ctx(t), withKey, client.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if second.JobID != first.JobID || !second.Existing {
		t.Fatalf("second receipt %+v, want existing %s", second, first.JobID)
	}
	if n := submitted(t, b.js); n != 1 {
		t.Fatalf("%d submissions stored, want 1", n)
	}
}

func TestSubmitWithoutKeyGetsFreshIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r1, err := b.client.Submit(ctx(t), []byte(diamond), client.SubmitOptions{NoReply: true})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.client.Submit(ctx(t), []byte(diamond), client.SubmitOptions{NoReply: true})
	if err != nil {
		t.Fatal(err)
	}
	if r1.JobID == r2.JobID || !protocol.ValidToken(r1.JobID) {
		t.Fatalf("ids %q %q", r1.JobID, r2.JobID)
	}
}

// answer plays the scheduler's side of the submission protocol once: it
// takes the next submission and replies with what reply returns.
func answer(t *testing.T, b bundle, reply func(m jetstream.Msg) protocol.SubmitReply) {
	t.Helper()
	c, err := b.js.CreateOrUpdateConsumer(ctx(t), protocol.StreamSubmit, jetstream.ConsumerConfig{Durable: "test", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		m, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			return
		}
		body, _ := json.Marshal(reply(m))
		_ = b.nc.Publish(m.Headers().Get(protocol.HeaderReplyTo), body)
		_ = m.Ack()
	}()
}

func TestSubmitConfirmedByScheduler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	answer(t, b, func(m jetstream.Msg) protocol.SubmitReply {
		return protocol.SubmitReply{JobID: m.Headers().Get(protocol.HeaderJobID)}
	})
	r, err := b.client.Submit(ctx(t), []byte(diamond), client.SubmitOptions{ReplyTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Confirmed || r.Existing || r.Name != "deploy" {
		t.Fatalf("receipt %+v", r)
	}
}

func TestSubmitRejectedByScheduler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	answer(t, b, func(m jetstream.Msg) protocol.SubmitReply {
		return protocol.SubmitReply{JobID: m.Headers().Get(protocol.HeaderJobID), Error: "invalid job spec: too_large: 3 steps, the limit is 2"}
	})
	_, err := b.client.Submit(ctx(t), []byte(diamond), client.SubmitOptions{ReplyTimeout: 10 * time.Second})
	var rej *client.RejectedError
	if !errors.As(err, &rej) || !errors.Is(err, client.ErrRejected) {
		t.Fatalf("got %v, want a RejectedError", err)
	}
	if rej.Reason != "invalid job spec: too_large: 3 steps, the limit is 2" {
		t.Fatalf("reason %q", rej.Reason)
	}
}

// The same idempotency key again within the stream's 2-minute duplicate
// window, after the scheduler rejected the first submission: the stream
// drops it as a duplicate, and it was reported as the existing job though
// none existed (`warden submit --wait` then followed it for ever). It is
// the rejection again now.
func TestResubmissionOfARejectedKeyIsRejected(t *testing.T) {
	t.Parallel()
	b := setup(t)
	answer(t, b, func(m jetstream.Msg) protocol.SubmitReply {
		return protocol.SubmitReply{JobID: m.Headers().Get(protocol.HeaderJobID), Error: "unknown rate limit \"nightly\""}
	})
	withKey := []byte("idempotency_key: release-9\n" + diamond)
	if _, err := b.client.Submit(ctx(t), withKey, client.SubmitOptions{ReplyTimeout: 10 * time.Second}); !errors.Is(err, client.ErrRejected) {
		t.Fatalf("first submission: %v", err)
	}
	// answer acks the rejected message; the scheduler terminates it: both
	// remove it from the work queue. Wait for that before resubmitting.
	natstest.Eventually(t, 10*time.Second, "the rejected submission settled", func() bool { return submitted(t, b.js) == 0 })
	r, err := b.client.Submit(ctx(t), withKey, client.SubmitOptions{ReplyTimeout: 10 * time.Second})
	var rej *client.RejectedError
	if !errors.As(err, &rej) || rej.JobID != protocol.JobIDForKey("release-9") {
		t.Fatalf("resubmission: %+v %v, want it rejected", r, err)
	}
}

// No scheduler answers, and the caller's deadline is shorter than the
// reply timeout: the job is accepted all the same (the PubAck), so Submit
// returns its receipt, unconfirmed, before the deadline instead of an
// error.
func TestSubmitReturnsTheReceiptBeforeTheCallersDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := b.client.Submit(c, []byte(diamond), client.SubmitOptions{ReplyTimeout: 10 * time.Second})
	if err != nil || r.Confirmed || r.JobID == "" || r.Sequence == 0 {
		t.Fatalf("receipt %+v, err %v; want the unconfirmed receipt", r, err)
	}
	if c.Err() != nil {
		t.Fatalf("returned after the deadline")
	}
}

func TestSubmitWithoutStreamsFails(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	_, err := client.New(js, client.Options{}).Submit(ctx(t), []byte(diamond), client.SubmitOptions{})
	if !errors.Is(err, client.ErrNoSubmitStream) {
		t.Fatalf("got %v, want ErrNoSubmitStream", err)
	}
}

// A job whose steps have all ended is finishing (the scheduler writes its
// steps' records, then its own): a cancel then is refused as for a
// finished job. Accepted, it turned a job whose every step succeeded
// into cancelled, or with compensation undid the finished work.
func TestCancelOfAFinishingJobIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sp := spec.Job{Name: "f", Steps: []spec.Step{{ID: "a", Action: "echo"}, {ID: "b", Action: "echo"}}}
	now := time.Now().UTC()
	job := jobstore.NewJob("job-finishing", sp, now)
	job.State = jobstore.JobRunning
	steps, err := jobstore.NewSteps(job.ID, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.CreateJob(ctx(t), job); err != nil {
		t.Fatal(err)
	}
	for _, st := range steps {
		st.State, st.FinishedAt = jobstore.StepSucceeded, now
		if _, err := b.store.CreateStep(ctx(t), st); err != nil {
			t.Fatal(err)
		}
	}
	for _, cancel := range []func(context.Context, string) (client.CancelReport, error){b.client.Cancel, b.client.CancelCompensate} {
		if _, err := cancel(ctx(t), job.ID); !errors.Is(err, client.ErrFinished) {
			t.Fatalf("cancel of a job whose steps have all ended: %v, want ErrFinished", err)
		}
	}
	if j, _, err := b.store.Job(ctx(t), job.ID); err != nil || j.Desired != jobstore.JobSucceeded {
		t.Fatalf("the job's desired state after the refused cancels: %v %v", j.Desired, err)
	}
}

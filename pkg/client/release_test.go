package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ratelimit"
	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
)

// TestFollowSubmissionEndsWithARejectionAtRelease: a delayed job is checked
// again when it is released, as a new submission with a later stream
// sequence; a scheduler that no longer defines the rate limit it names
// rejects it then. FollowSubmission (submit --wait) returns that
// rejection instead of waiting for ever for a job that will never exist.
func TestFollowSubmissionEndsWithARejectionAtRelease(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	stop := s.startScheduler(t, scheduler.Config{RateLimits: ratelimit.Config{"crm": {Limit: 10, Interval: protocol.Duration(time.Second)}}})
	r, err := s.client.Submit(ctx(t), []byte(`{"name":"later","delay":"1s","steps":[{"id":"s","action":"echo","rate_limit":"crm"}]}`), client.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Confirmed || r.StartsAt.IsZero() {
		t.Fatalf("receipt %+v, want confirmed and delayed", r)
	}
	stop()
	s.startScheduler(t, scheduler.Config{}) // no rate limit "crm" any more

	fctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	j, err := s.client.FollowSubmission(fctx, r, nil)
	var rej *client.RejectedError
	if !errors.As(err, &rej) || rej.JobID != r.JobID {
		t.Fatalf("FollowSubmission = %+v, %v; want the rejection of job %s at its release", j, err, r.JobID)
	}
	t.Logf("rejected at release: %s", rej.Reason)
}

// TestDuplicateDuringReleaseIsTheJob: a keyed delayed job is submitted
// again (within the 2-minute duplicate window, so the server drops the
// repeat) while its release is on its way to the scheduler: released onto
// warden.delayed.<job> with no relay running yet, then submitted again on
// warden.submit by a relay with no scheduler running. Each time the repeat
// is the existing job, not a rejection; and the job then runs.
func TestDuplicateDuringReleaseIsTheJob(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	stop := s.startScheduler(t, scheduler.Config{})
	body := []byte(`{"name":"later","idempotency_key":"release-during-resubmit","delay":"1s","steps":[{"id":"s","action":"echo"}]}`)
	first, err := s.client.Submit(ctx(t), body, client.SubmitOptions{})
	if err != nil || !first.Confirmed {
		t.Fatalf("first submission: %+v, %v", first, err)
	}
	stop() // nothing relays the release now
	job := first.JobID
	delay, err := s.js.Stream(ctx(t), protocol.StreamDelay)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 20*time.Second, "the server released the submission onto "+protocol.DelayedSubject(job), func() bool {
		_, err := delay.GetLastMsgForSubject(ctx(t), protocol.DelayedSubject(job))
		return err == nil
	})
	again, err := s.client.Submit(ctx(t), body, client.SubmitOptions{})
	if err != nil || !again.Existing || again.JobID != job {
		t.Fatalf("repeat while released, not yet relayed: %+v, %v; want the existing job %s", again, err, job)
	}

	// A relay alone: the release goes back to warden.submit, and no
	// scheduler takes it.
	rctx, stopRelay := context.WithCancel(context.Background())
	relayDone := make(chan error, 1)
	go func() { relayDone <- schedule.RunDelayRelay(rctx, s.js, zerolog.Nop()) }()
	submit, err := s.js.Stream(ctx(t), protocol.StreamSubmit)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 20*time.Second, "the release submitted again on warden.submit", func() bool {
		_, derr := delay.GetLastMsgForSubject(ctx(t), protocol.DelayedSubject(job))
		_, serr := submit.GetLastMsgForSubject(ctx(t), protocol.SubjectSubmit+".*."+job)
		return errors.Is(derr, jetstream.ErrMsgNotFound) && serr == nil
	})
	stopRelay()
	if err := <-relayDone; err != nil {
		t.Fatal(err)
	}
	again, err = s.client.Submit(ctx(t), body, client.SubmitOptions{})
	if err != nil || !again.Existing || again.JobID != job {
		t.Fatalf("repeat while the release waits in WARDEN_SUBMIT: %+v, %v; want the existing job %s", again, err, job)
	}

	s.startScheduler(t, scheduler.Config{})
	agenttest.StartAgent(t, s.nc, agent.Config{ID: "a1", Pool: "default"})
	natstest.Eventually(t, 20*time.Second, "the job succeeded", func() bool {
		j, _, err := s.store.Job(ctx(t), job)
		return err == nil && j.State == jobstore.JobSucceeded
	})
}

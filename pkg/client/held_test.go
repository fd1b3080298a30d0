package client_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// system is a server with the deployment's default settings, the streams
// applied, and schedulers started on demand.
type system struct {
	srv    *natstest.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	store  *jobstore.Store
	client *client.Client
}

func newSystem(t *testing.T) *system {
	t.Helper()
	srv, nc, js := natstest.Start(t, streams.Options{})
	st, err := jobstore.Open(ctx(t), js)
	if err != nil {
		t.Fatal(err)
	}
	return &system{srv: srv, nc: nc, js: js, store: st, client: client.New(js, client.Options{})}
}

// startScheduler runs a real scheduler with cfg on its own connection; stop
// stops it and waits until it has (also at the end of the test).
func (s *system) startScheduler(t *testing.T, cfg scheduler.Config) (stop func()) {
	t.Helper()
	nc, _ := s.srv.Connect(t)
	log := zerolog.Nop()
	if testing.Verbose() {
		log = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	}
	sched, err := scheduler.New(cfg, nc, scheduler.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sched.Run(c) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("scheduler: %v", err)
		}
	}
	t.Cleanup(stop)
	// Ready once it answers advance requests, the last thing it starts.
	natstest.Eventually(t, 20*time.Second, "the scheduler answers", func() bool {
		_, err := s.nc.Request(protocol.SubjectControlAdvance, []byte("job-none"), time.Second)
		return err == nil
	})
	return stop
}

// gone reports whether nothing of job's submission is left in WARDEN_SUBMIT
// or WARDEN_DELAY: before its start time it waits on warden.delay.<job>,
// then on warden.delayed.<job>, then again in WARDEN_SUBMIT until a
// scheduler has handled it (written the record, or found one) and acked it.
func (s *system) gone(t *testing.T, job string) bool {
	t.Helper()
	for _, p := range []struct{ stream, subject string }{
		{protocol.StreamSubmit, protocol.SubjectSubmit + ".*." + job},
		{protocol.StreamDelay, protocol.DelaySubject(job)},
		{protocol.StreamDelay, protocol.DelayedSubject(job)},
	} {
		st, err := s.js.Stream(ctx(t), p.stream)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.GetLastMsgForSubject(ctx(t), p.subject); !errors.Is(err, jetstream.ErrMsgNotFound) {
			return false
		}
	}
	return true
}

// ran returns the jobs the agent received a task of.
func ran(a *agenttest.Agent) []string {
	var jobs []string
	for _, task := range a.Received() {
		jobs = append(jobs, task.JobID)
	}
	return jobs
}

func stepIDs(t *testing.T, specText string) []string {
	t.Helper()
	sp, err := spec.Parse([]byte(specText), spec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, st := range sp.Steps {
		ids = append(ids, st.ID)
	}
	return ids
}

// TestCancelDelayedJobBeforeItsStart: a job with delay: 2s, cancelled at
// once, is reported as delayed until then, cancels, ends cancelled, and
// never runs: its submission is released at its time and the scheduler
// that takes it finds the job ended. A job of one step (kept inline in the
// job record) and one of three are cancelled; a third job submitted with
// them is not, and runs on the same agent.
func TestCancelDelayedJobBeforeItsStart(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.startScheduler(t, scheduler.Config{})
	a := agenttest.StartAgent(t, s.nc, agent.Config{ID: "a1", Pool: "default"})

	specs := map[string]string{
		"one":     `{"name":"one","delay":"2s","steps":[{"id":"s","action":"echo"}]}`,
		"three":   `{"name":"three","delay":"2s","steps":[{"id":"a","action":"echo"},{"id":"b","action":"echo","depends_on":["a"]},{"id":"c","action":"echo","depends_on":["a"]}]}`,
		"control": `{"name":"control","delay":"2s","steps":[{"id":"s","action":"echo"}]}`,
	}
	ids := map[string]client.Receipt{}
	for _, name := range []string{"one", "three", "control"} {
		r, err := s.client.Submit(ctx(t), []byte(specs[name]), client.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !r.Confirmed || r.StartsAt.IsZero() {
			t.Fatalf("%s: receipt %+v, want confirmed and delayed", name, r)
		}
		ids[name] = r
	}

	for _, name := range []string{"one", "three"} {
		r := ids[name]
		d, err := s.client.Job(ctx(t), r.JobID)
		if err != nil {
			t.Fatalf("%s: Job before its start: %v", name, err)
		}
		if d.Held != client.HeldDelayed || d.Job.State != client.JobPending || d.Job.Name != name ||
			d.StartsAt.Sub(r.StartsAt).Abs() > time.Second {
			t.Fatalf("%s: Job before its start: held %q, state %s, starts %s; want delayed, pending, starts ~%s", name, d.Held, d.Job.State, d.StartsAt, r.StartsAt)
		}
		rep, err := s.client.Cancel(ctx(t), r.JobID)
		if err != nil {
			t.Fatalf("%s: Cancel before its start: %v (%s before the start time)", name, err, time.Until(r.StartsAt).Round(time.Millisecond))
		}
		if want := stepIDs(t, specs[name]); !slices.Equal(rep.Cancelled, want) || len(rep.Interrupted) > 0 {
			t.Fatalf("%s: cancel report %+v, want every step cancelled %v", name, rep, want)
		}
	}
	for _, name := range []string{"one", "three"} {
		r := ids[name]
		j, err := s.client.Follow(ctx(t), r.JobID, nil)
		if err != nil || j.State != client.JobCancelled {
			t.Fatalf("%s: Follow after the cancel: %+v, %v; want cancelled", name, j, err)
		}
		if _, err := s.client.Cancel(ctx(t), r.JobID); !errors.Is(err, client.ErrFinished) {
			t.Fatalf("%s: a second cancel: %v, want ErrFinished", name, err)
		}
	}

	// Past the start time: every release taken by the scheduler, and the
	// job not cancelled run.
	natstest.Eventually(t, 30*time.Second, "every submission released and handled, the control job succeeded", func() bool {
		for _, r := range ids {
			if !s.gone(t, r.JobID) {
				return false
			}
		}
		j, _, err := s.store.Job(ctx(t), ids["control"].JobID)
		return err == nil && j.State == jobstore.JobSucceeded
	})
	for _, name := range []string{"one", "three"} {
		id := ids[name].JobID
		if slices.Contains(ran(a), id) {
			t.Fatalf("%s: the agent ran a step of the cancelled job %s", name, id)
		}
		d, err := s.client.Job(ctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if d.Held != "" || d.Job.State != client.JobCancelled || len(d.Steps) != len(stepIDs(t, specs[name])) {
			t.Fatalf("%s: after its start time: held %q, state %s, %d steps; want its cancelled record", name, d.Held, d.Job.State, len(d.Steps))
		}
		for _, st := range d.Steps {
			if st.State != client.StepCancelled || st.Epoch != 0 {
				t.Fatalf("%s: step %s is %s at epoch %d, want cancelled, never dispatched", name, st.ID, st.State, st.Epoch)
			}
		}
	}
	if !slices.Contains(ran(a), ids["control"].JobID) {
		t.Fatal("the control job succeeded without the agent")
	}
}

// heldSubmission holds a submission of job in WARDEN_DELAY until at, as a
// scheduler does (schedule.PublishDelayed).
func heldSubmission(t *testing.T, js jetstream.JetStream, job, specText string, at time.Time) {
	t.Helper()
	m := schedule.Resubmission(job, []byte(specText), nats.Header{})
	if _, err := schedule.PublishDelayed(ctx(t), js, m, at); err != nil {
		t.Fatal(err)
	}
}

// TestCancelHeldJobThatIsMadeMeanwhile: the job's record appears between
// Cancel finding its held submission and creating the cancelled record
// (the release was taken meanwhile): Cancel cancels that record, as for
// any job made, instead of failing or overwriting it.
func TestCancelHeldJobThatIsMadeMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const id = "job-made-meanwhile"
	heldSubmission(t, b.js, id, diamond, time.Now().Add(time.Hour))
	created := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	restore := client.SetHeldHook(func(job string) {
		if job == id {
			materialise(t, b, id, diamond, created)
		}
	})
	defer restore()
	rep, err := b.client.Cancel(ctx(t), id)
	if err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	if !slices.Equal(rep.Cancelled, []string{"fetch", "test", "lint", "release"}) {
		t.Fatalf("report %+v, want the made job's pending steps", rep)
	}
	snap, err := b.store.Load(ctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Job.CreatedAt.Equal(created) || snap.Job.Desired != jobstore.JobCancelled || snap.Job.State != jobstore.JobPending {
		t.Fatalf("record %+v: want the one made meanwhile (created %s), desired cancelled", snap.Job, created)
	}
	for _, st := range snap.Steps {
		if st.Desired != jobstore.StepCancelled {
			t.Fatalf("step %s desired %s, want cancelled (no scheduler answered: Cancel writes it)", st.ID, st.Desired)
		}
	}
}

// TestCancelQueuedJobBeforeASchedulerTakesIt: a submission waits in
// WARDEN_SUBMIT while no scheduler runs. Job reports it queued; Cancel
// cancels it; the scheduler that starts later takes the submission, finds
// the job ended and runs nothing, while a job submitted after it runs.
func TestCancelQueuedJobBeforeASchedulerTakesIt(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	r, err := s.client.Submit(ctx(t), []byte(diamond), client.SubmitOptions{NoReply: true})
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.client.Job(ctx(t), r.JobID)
	if err != nil || d.Held != client.HeldQueued || d.Job.State != client.JobPending || !d.StartsAt.IsZero() {
		t.Fatalf("Job of a queued submission: %+v, %v; want held queued, pending", d, err)
	}
	if _, err := s.client.Cancel(ctx(t), r.JobID); err != nil {
		t.Fatalf("Cancel of a queued submission: %v", err)
	}

	s.startScheduler(t, scheduler.Config{})
	a := agenttest.StartAgent(t, s.nc, agent.Config{ID: "a1", Pool: "default"})
	control, err := s.client.Submit(ctx(t), []byte(`{"name":"control","steps":[{"id":"s","action":"echo"}]}`), client.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 20*time.Second, "the cancelled job's submission handled, the control job succeeded", func() bool {
		j, _, err := s.store.Job(ctx(t), control.JobID)
		return s.gone(t, r.JobID) && err == nil && j.State == jobstore.JobSucceeded
	})
	if slices.Contains(ran(a), r.JobID) {
		t.Fatal("the agent ran a step of the job cancelled while queued")
	}
	j, _, err := s.store.Job(ctx(t), r.JobID)
	if err != nil || j.State != jobstore.JobCancelled {
		t.Fatalf("record %+v, %v; want cancelled", j, err)
	}
}

// Following a queued job (accepted while no scheduler ran) that the
// scheduler then rejects ends with the rejection. Follow looked for
// rejections only when given a submission's receipt (submit --wait), so
// `warden job follow` of such a job waited for ever: no record is ever
// written for a rejected submission.
//
// Old code: "following job …: context deadline exceeded".
func TestFollowOfAQueuedJobTheSchedulerRejectsEnds(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	r, err := s.client.Submit(ctx(t), []byte(`{"name":"q","steps":[{"id":"s","action":"echo","rate_limit":"crm"}]}`), client.SubmitOptions{NoReply: true})
	if err != nil {
		t.Fatal(err)
	}
	s.startScheduler(t, scheduler.Config{}) // knows no rate limit "crm": rejects it
	fctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err = s.client.Follow(fctx, r.JobID, nil)
	if !errors.Is(err, client.ErrRejected) {
		t.Fatalf("follow of a rejected queued job: %v, want %v", err, client.ErrRejected)
	}
}

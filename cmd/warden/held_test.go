package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
)

// TestJobShowAndCancelDelayedJob: a job held by the scheduler in
// WARDEN_DELAY until its start time has no record yet. `job show` reports
// it delayed with its start time (it said not found, exit 3), `job cancel`
// cancels it (it said not found, and the job ran at its time), and `job
// show` then reports it cancelled.
func TestJobShowAndCancelDelayedJob(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const id = "job-later"
	at := time.Now().Add(time.Hour).UTC()
	m := schedule.Resubmission(id, []byte("name: later\ndelay: 1h\nsteps: [{id: a, action: echo}, {id: b, action: echo, depends_on: [a]}]\n"), nats.Header{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := schedule.PublishDelayed(ctx, e.js, m, at); err != nil {
		t.Fatal(err)
	}

	r := warden(t, "", "job", "show", id, "--server", e.url)
	if r.code != exitOK || !strings.Contains(r.stdout, "pending (delayed: starts ") || !strings.Contains(r.stdout, "2 steps not materialised yet") {
		t.Fatalf("job show of a delayed job: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = warden(t, "", "job", "show", id, "--json", "--server", e.url)
	var d client.JobDetail
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || r.code != exitOK {
		t.Fatalf("job show --json: exit %d, %v\n%s", r.code, err, r.stdout)
	}
	if d.Held != client.HeldDelayed || !d.StartsAt.Equal(at) || d.Job.ID != id || d.Job.State != jobstore.JobPending {
		t.Fatalf("job show --json: %+v, want held delayed until %s", d, at)
	}

	r = warden(t, "", "job", "cancel", id, "--server", e.url)
	if r.code != exitOK || !strings.Contains(r.stdout, "2 pending steps cancelled") || !strings.Contains(r.stdout, "job cancelled") {
		t.Fatalf("job cancel of a delayed job: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = warden(t, "", "job", "show", id, "--server", e.url)
	if r.code != exitOK || !strings.Contains(r.stdout, "cancelled (desired cancelled)") || strings.Contains(r.stdout, "delayed") {
		t.Fatalf("job show after the cancel: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}

// wardenUntil runs the CLI in-process until it returns, with Ctrl-C (its
// context cancelled) once interrupt returns.
func wardenUntil(t *testing.T, interrupt func(), args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		interrupt()
		cancel()
	}()
	var out, errb bytes.Buffer
	code := run(ctx, args, strings.NewReader(""), &out, &errb)
	return result{code, out.String(), errb.String()}
}

// TestSubmitInterruptedWhileWaitingPrintsTheJob: Ctrl-C while submit waits
// for the scheduler's reply (none runs). The job is stored and will run;
// the CLI printed only the interrupt, without the job's id.
func TestSubmitInterruptedWhileWaitingPrintsTheJob(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := wardenUntil(t, func() { untilStored(e.js) }, "submit", "-f", "../../examples/deploy.yaml", "--timeout", "1m", "--server", e.url)
	s, err := e.js.Stream(context.Background(), protocol.StreamSubmit)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(context.Background(), protocol.SubjectSubmit+".>")
	if err != nil {
		t.Fatal(err)
	}
	id := m.Header.Get(protocol.HeaderJobID)
	t.Logf("stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	// The interrupt comes once the submission is stored, which may be just
	// before its PubAck reaches the CLI: then the CLI cannot know it was
	// stored and says the job may have been. Either way it names the job.
	accepted := strings.Contains(r.stdout, "job "+id+" ")
	unknown := strings.Contains(r.stderr, "job "+id+" ") && strings.Contains(r.stderr, "may have been stored")
	if r.code == exitOK || !strings.Contains(r.stderr, id) || (!accepted && !unknown) {
		t.Fatalf("interrupted submit of job %s: exit %d\nstdout:\n%s\nstderr:\n%s", id, r.code, r.stdout, r.stderr)
	}
}

// untilStored returns once WARDEN_SUBMIT holds a submission, or after 20 s.
func untilStored(js jetstream.JetStream) {
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if s, err := js.Stream(context.Background(), protocol.StreamSubmit); err == nil {
			if info, err := s.Info(context.Background()); err == nil && info.State.Msgs > 0 {
				return
			}
		}
	}
}

// TestSubmitWithoutPubAckPrintsTheJob: the server took the submission and
// its PubAck never came (here nothing but a plain subscriber listens, and
// the wait is interrupted). The CLI cannot know whether the job was
// stored: it names the job, says it may have been, and how to check,
// rather than only the error (after which a retry made a second job).
func TestSubmitWithoutPubAckPrintsTheJob(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t) // no streams
	nc, _ := srv.Connect(t)
	got := make(chan string, 1)
	sub, err := nc.Subscribe(protocol.SubjectSubmit+".>", func(m *nats.Msg) { got <- m.Header.Get(protocol.HeaderJobID) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var id string
	r := wardenUntil(t, func() {
		select {
		case id = <-got:
		case <-time.After(20 * time.Second):
		}
	}, "submit", "-f", "../../examples/deploy.yaml", "--server", srv.URL)
	if id == "" {
		t.Fatalf("nothing published: exit %d, stderr %q", r.code, r.stderr)
	}
	t.Logf("stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	if r.code != exitUnavailable || !strings.Contains(r.stderr, "job "+id+" ") || !strings.Contains(r.stderr, "may have been stored") ||
		!strings.Contains(r.stderr, "warden job show "+id) {
		t.Fatalf("submit without a PubAck (job %s): exit %d\nstdout:\n%s\nstderr:\n%s", id, r.code, r.stdout, r.stderr)
	}
}

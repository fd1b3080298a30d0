package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// materialise writes a job and its steps as the scheduler would.
func materialise(t *testing.T, b bundle, id, specText string, created time.Time) (*jobstore.Job, []*jobstore.Step) {
	t.Helper()
	sp, err := spec.Parse([]byte(specText), spec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	j := jobstore.NewJob(id, *sp, created)
	steps, err := jobstore.NewSteps(id, *sp, jobstore.StepDefaults{Timeout: time.Minute}, created)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if _, err := b.store.CreateStep(ctx(t), s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.store.CreateJob(ctx(t), j); err != nil {
		t.Fatal(err)
	}
	return j, steps
}

// succeed drives a step through dispatch and a successful result.
func succeed(t *testing.T, b bundle, jobID, stepID, agent string) {
	t.Helper()
	s, rev, err := b.store.Step(ctx(t), jobID, stepID)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := s.Dispatch(agent, "", now, time.Second); err != nil {
		t.Fatal(err)
	}
	if rev, err = b.store.UpdateStep(ctx(t), s, rev); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ApplyResult(protocol.Result{Epoch: s.Epoch, Agent: agent, Status: protocol.ResultSucceeded}, false, now); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.UpdateStep(ctx(t), s, rev); err != nil {
		t.Fatal(err)
	}
}

func setJobState(t *testing.T, b bundle, id string, state jobstore.JobState) {
	t.Helper()
	j, rev, err := b.store.Job(ctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	j.State = state
	if _, err := b.store.UpdateJob(ctx(t), j, rev); err != nil {
		t.Fatal(err)
	}
}

func TestFollowReturnsWhenJobTerminal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	materialise(t, b, "job-follow", diamond, time.Now())

	ready := make(chan struct{})
	updates := make(chan client.Update, 64)
	type outcome struct {
		job *jobstore.Job
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		j, err := b.client.Follow(ctx(t), "job-follow", func(u client.Update) {
			if u.Initial {
				close(ready)
				return
			}
			updates <- u
		})
		done <- outcome{j, err}
	}()
	<-ready

	for _, s := range []string{"fetch", "test", "lint", "release"} {
		succeed(t, b, "job-follow", s, "agent-1")
	}
	setJobState(t, b, "job-follow", jobstore.JobSucceeded)

	var out outcome
	select {
	case out = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Follow did not return after the job succeeded")
	}
	if out.err != nil || out.job.State != jobstore.JobSucceeded {
		t.Fatalf("Follow = %+v, %v", out.job, out.err)
	}
	close(updates)
	var succeeded int
	for u := range updates {
		if u.Step != nil && u.Step.State == jobstore.StepSucceeded {
			succeeded++
			if u.Step.Actor != "agent-1" || u.Step.Epoch != 1 {
				t.Fatalf("step update %+v", u.Step)
			}
		}
		if len(u.Steps) != 4 || u.Steps[0].ID != "fetch" || u.Steps[3].ID != "release" {
			t.Fatalf("steps not in spec order: %d", len(u.Steps))
		}
	}
	if succeeded != 4 {
		t.Fatalf("saw %d step successes, want 4", succeeded)
	}
}

func TestFollowWaitsForAJobNotYetWritten(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		j, err := b.client.Follow(ctx(t), "job-later", func(u client.Update) {
			if u.Initial {
				if u.Job != nil {
					t.Error("job exists before it was written")
				}
				close(ready)
			}
		})
		if err == nil && j.State != jobstore.JobFailed {
			err = errors.New("final state " + string(j.State))
		}
		done <- err
	}()
	<-ready
	materialise(t, b, "job-later", "name: x\nsteps: [{id: a, action: echo}]", time.Now())
	setJobState(t, b, "job-later", jobstore.JobFailed)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Follow did not return")
	}
}

func TestFollowTerminalJobReturnsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	materialise(t, b, "job-old", diamond, time.Now())
	setJobState(t, b, "job-old", jobstore.JobCancelled)
	j, err := b.client.Follow(ctx(t), "job-old", nil)
	if err != nil || j.State != jobstore.JobCancelled {
		t.Fatalf("Follow = %v, %v", j, err)
	}
}

func TestJobsListsNewestFirstAndFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	base := time.Now().Add(-time.Hour)
	materialise(t, b, "job-a", diamond, base)
	materialise(t, b, "job-b", diamond, base.Add(time.Minute))
	materialise(t, b, "job-c", diamond, base.Add(2*time.Minute))
	succeed(t, b, "job-b", "fetch", "agent-1")
	setJobState(t, b, "job-b", jobstore.JobRunning)

	page, err := b.client.Jobs(ctx(t), client.JobFilter{})
	if err != nil {
		t.Fatal(err)
	}
	all := page.Jobs
	if len(all) != 3 || all[0].ID != "job-c" || all[2].ID != "job-a" || page.Next != "" {
		t.Fatalf("order wrong: %+v (next %q)", all, page.Next)
	}
	page, err = b.client.Jobs(ctx(t), client.JobFilter{State: jobstore.JobRunning})
	if err != nil {
		t.Fatal(err)
	}
	running := page.Jobs
	if len(running) != 1 || running[0].ID != "job-b" || running[0].StepsDone != 1 || running[0].StepsTotal != 4 {
		t.Fatalf("running: %+v", running)
	}
	// Pages of two: the newest two, then the last one.
	first, err := b.client.Jobs(ctx(t), client.JobFilter{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	rest, err := b.client.Jobs(ctx(t), client.JobFilter{Limit: 2, Cursor: first.Next})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Jobs) != 2 || first.Next == "" || len(rest.Jobs) != 1 || rest.Jobs[0].ID != "job-a" || rest.Next != "" {
		t.Fatalf("pages of 2: %+v (next %q), then %+v (next %q)", first.Jobs, first.Next, rest.Jobs, rest.Next)
	}
}

func TestJobShowAndNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	materialise(t, b, "job-x", diamond, time.Now())
	d, err := b.client.Job(ctx(t), "job-x")
	if err != nil {
		t.Fatal(err)
	}
	if d.Job.Name != "deploy" || len(d.Steps) != 4 || d.Steps[3].ID != "release" {
		t.Fatalf("detail %+v", d)
	}
	for _, id := range []string{"job-nope", "not.a.token"} {
		if _, err := b.client.Job(ctx(t), id); !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("Job(%q) = %v, want ErrNotFound", id, err)
		}
	}
}

// A submission whose reply wait ran out (no scheduler up) and that the
// scheduler later rejected has no job record, ever: following it waited
// forever (`warden submit --wait` hung). FollowSubmission returns the
// rejection of this very submission; another submission's rejection of
// the same id does not stop it.
func TestFollowSubmissionReturnsItsRejection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := b.client.Submit(ctx(t), []byte(diamond), client.SubmitOptions{})
	if err != nil || r.Confirmed || r.Sequence == 0 {
		t.Fatalf("submit with no scheduler: %+v %v", r, err)
	}
	reject := func(seq uint64) {
		t.Helper()
		e := protocol.Event{Kind: protocol.EventSubmissionRejected, ID: r.JobID, JobID: r.JobID, Reason: "too_large: spec is over the limit",
			Data: map[string]string{"reason": "too_large", "stream_seq": strconv.FormatUint(seq, 10)}}
		body, _ := json.Marshal(e)
		if _, err := b.js.Publish(ctx(t), protocol.EventSubject(e.Kind, e.ID), body); err != nil {
			t.Fatal(err)
		}
	}
	reject(r.Sequence + 1000) // an earlier submission's, say
	short, cancel := context.WithTimeout(ctx(t), 2500*time.Millisecond)
	defer cancel()
	if _, err := b.client.FollowSubmission(short, r, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("follow with another submission's rejection: %v, want to keep waiting", err)
	}
	reject(r.Sequence)
	_, err = b.client.FollowSubmission(ctx(t), r, nil)
	var rej *client.RejectedError
	if !errors.As(err, &rej) || !strings.Contains(rej.Reason, "too_large") {
		t.Fatalf("follow after its rejection: %v, want a RejectedError", err)
	}
}

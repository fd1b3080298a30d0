package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/client"
)

// A step waiting for an agent is rewritten with the same reason and a new
// age ("gone 3s ago") every second: submit --wait printed a line for each.
// It prints a waiting line when the reason changes, not its age.
func TestProgressPrintsAWaitingReasonOnce(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	p := newProgress(&b)
	job := &jobstore.Job{ID: "job-w", State: jobstore.JobPending}
	p.update(client.Update{Initial: true, Job: job})
	gone := "no eligible agent: action echo in pool default (offered only by agents now offline, the last gone %s ago)"
	for _, age := range []string{"1s", "2s", "3s", "59s", "1m0s", "1m1s"} {
		p.update(client.Update{Job: job, Step: &jobstore.Step{ID: "a", State: jobstore.StepPending, Waiting: fmt.Sprintf(gone, age)}})
	}
	p.update(client.Update{Job: job, Step: &jobstore.Step{ID: "a", State: jobstore.StepPending, Waiting: "waiting for rate limit deploys"}})
	p.update(client.Update{Job: job, Step: &jobstore.Step{ID: "a", State: jobstore.StepPending, Waiting: fmt.Sprintf(gone, "2m0s")}})
	if n := strings.Count(b.String(), "waiting: "); n != 3 {
		t.Fatalf("%d waiting lines, want 3 (one per change of reason):\n%s", n, b.String())
	}
	if !strings.Contains(b.String(), "the last gone 1s ago") || !strings.Contains(b.String(), "the last gone 2m0s ago") {
		t.Fatalf("waiting lines lack their reason as written:\n%s", b.String())
	}
}

// A delayed submission has no job record until it starts: submit --wait
// said "waiting for a scheduler to take the job..." for the whole delay.
func TestProgressSaysWhenADelayedJobStarts(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	p := newProgress(&b)
	p.startsAt = time.Now().Add(time.Hour)
	p.update(client.Update{Initial: true})
	want := "job is delayed: starts " + timestamp(p.startsAt) + ", in "
	if !strings.Contains(b.String(), want) || strings.Contains(b.String(), "waiting for a scheduler") {
		t.Fatalf("got %q, want it to say %q", b.String(), want)
	}

	b.Reset()
	p = newProgress(&b)
	p.update(client.Update{Initial: true})
	if b.String() != "waiting for a scheduler to take the job...\n" {
		t.Fatalf("a job due now: got %q", b.String())
	}
}

// The cancel report said "1 pending steps cancelled".
func TestPrintCancelCountsInTheSingular(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		rep  ops.CancelReport
		want string
	}{
		{ops.CancelReport{JobID: "j", Cancelled: []string{"a"}, Interrupted: []string{"b"}}, "job j cancelled: 1 pending step cancelled, 1 running step interrupted (b)"},
		{ops.CancelReport{JobID: "j", Cancelled: []string{"a", "b"}}, "job j cancelled: 2 pending steps cancelled, 0 running steps interrupted"},
	} {
		var b bytes.Buffer
		a := &app{stdout: &b}
		a.printCancel(c.rep)
		if b.String() != c.want {
			t.Errorf("got %q, want %q", b.String(), c.want)
		}
	}
}

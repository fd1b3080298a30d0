package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// `warden job show` says when a running job's timeout runs out, and that
// a job timed out; a finished job that did not says nothing of it.
func TestJobShowPrintsTheTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	now := time.Now().UTC()
	sp := spec.Job{Name: "bounded", Timeout: protocol.Duration(time.Hour), Steps: []spec.Step{{ID: "a", Action: "echo"}}}
	put := func(id string, edit func(*jobstore.Job)) {
		j := jobstore.NewJob(id, sp, now)
		edit(j)
		if _, err := e.store.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	put("job-running", func(j *jobstore.Job) { j.State = jobstore.JobRunning })
	put("job-timed-out", func(j *jobstore.Job) {
		j.State, j.Desired, j.TimedOut, j.FinishedAt = jobstore.JobFailed, jobstore.JobCancelled, true, now
		j.Error = j.TimeoutError()
	})
	put("job-done", func(j *jobstore.Job) { j.State, j.FinishedAt = jobstore.JobSucceeded, now })
	for id, want := range map[string]string{
		"job-running":   "Timeout:  1h0m0s, runs out ",
		"job-timed-out": "Timeout:  1h0m0s, ran out ",
		"job-done":      "",
	} {
		r := warden(t, "", "job", "show", id, "--server", e.url)
		if r.code != exitOK || want != "" && !strings.Contains(r.stdout, want) || want == "" && strings.Contains(r.stdout, "Timeout:") {
			t.Errorf("job show %s: exit %d, want %q\nstdout:\n%s\nstderr:\n%s", id, r.code, want, r.stdout, r.stderr)
		}
	}
}

package jobstore

import (
	"testing"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// A job's timeout runs from its acceptance and starts again when an
// operator reopens it; its record carries the deadline as a header (the
// supervisor's recovery reads headers only) while a scheduler has it to
// act on: not once the job is being cancelled, compensates or has ended.
func TestJobDeadline(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 28, 6, 0, 0, 0, time.UTC)
	j := NewJob("j", spec.Job{Name: "n", Timeout: protocol.Duration(time.Hour)}, t0)
	if want := t0.Add(time.Hour); !j.Deadline.Equal(want) {
		t.Fatalf("deadline %v, want %v", j.Deadline, want)
	}
	if NewJob("k", spec.Job{Name: "n"}, t0).Deadline != (time.Time{}) {
		t.Fatal("a job without a timeout has a deadline")
	}
	s := &Store{}
	header := func(j *Job) string { return s.JobWrite(j, 0).Msg.Header.Get(protocol.HeaderRecordDeadline) }
	if got := header(j); got != "2026-11-28T07:00:00Z" {
		t.Fatalf("deadline header %q", got)
	}
	for _, c := range []struct {
		name string
		edit func(*Job)
	}{
		{"being cancelled", func(j *Job) { j.Desired, j.TimedOut = JobCancelled, true }},
		{"compensating", func(j *Job) { j.State = JobCompensating }},
		{"ended", func(j *Job) { j.State = JobFailed }},
	} {
		j := NewJob("j", spec.Job{Name: "n", Timeout: protocol.Duration(time.Hour)}, t0)
		c.edit(j)
		if got := header(j); got != "" {
			t.Errorf("%s: deadline header %q", c.name, got)
		}
	}
	j.Desired, j.TimedOut, j.State = JobCancelled, true, JobFailed
	later := t0.Add(2 * time.Hour)
	j.Error = "timed out"
	j.Reopen(later)
	if j.TimedOut || j.Desired != JobSucceeded || j.State != JobRunning || j.Error != "" || !j.Deadline.Equal(later.Add(time.Hour)) {
		t.Fatalf("reopened: %+v", j)
	}
}

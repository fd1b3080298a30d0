package ops

import (
	"context"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
)

// JobSummary is one row of a job listing.
type JobSummary struct {
	jobstore.JobEntry
	Name  string `json:"name"`
	Error string `json:"error,omitempty"`
	// StepsDone counts steps in a terminal state; StepsTotal is the number
	// of steps in the spec.
	StepsDone  int       `json:"steps_done"`
	StepsTotal int       `json:"steps_total"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
}

// JobsPage is one page of a job listing, newest first.
type JobsPage struct {
	Jobs []JobSummary `json:"jobs"`
	// Next continues the listing (ListFilter.Cursor); empty on the last page.
	Next string `json:"next,omitempty"`
	// Matched counts the jobs that pass the filter.
	Matched int `json:"matched"`
	// Counts counts every job in the store by state.
	Counts map[jobstore.JobState]int `json:"counts"`
}

// ListJobs returns one page of jobs. It reads the job records' headers, then
// only the page's jobs, each record with its steps (jobstore.Store.List), so
// it stays fast with tens of thousands of finished jobs. A job whose
// retention ends meanwhile is left out of the page.
func (o *Ops) ListJobs(ctx context.Context, f jobstore.ListFilter) (JobsPage, error) {
	if f.Limit < 0 || f.Limit > jobstore.MaxListLimit {
		return JobsPage{}, Errorf(CodeInvalid, "limit %d: want 1 to %d (0: %d)", f.Limit, jobstore.MaxListLimit, jobstore.DefaultListLimit)
	}
	for _, s := range f.States {
		if !ValidJobState(s) {
			return JobsPage{}, Errorf(CodeInvalid, "state %q: want one of %v", s, JobStates)
		}
	}
	p, err := o.store.List(ctx, o.js, f)
	if err != nil {
		return JobsPage{}, err
	}
	out := JobsPage{Jobs: make([]JobSummary, 0, len(p.Jobs)), Next: p.Next, Matched: p.Matched, Counts: p.Counts}
	for _, lj := range p.Jobs {
		if lj.Unreadable != nil {
			out.Jobs = append(out.Jobs, JobSummary{JobEntry: lj.JobEntry, Error: "records unreadable: " + lj.Unreadable.Error()})
			continue
		}
		if lj.Job == nil {
			continue // its retention ended between the scan and the read
		}
		out.Jobs = append(out.Jobs, JobSummary{JobEntry: lj.JobEntry, Name: lj.Job.Name, Error: lj.Job.Error,
			StepsTotal: len(lj.Job.Spec.Steps), StepsDone: lj.StepsDone(), FinishedAt: lj.Job.FinishedAt})
	}
	return out, nil
}

// JobStates lists the job states, in lifecycle order.
var JobStates = jobstore.JobStates

// ValidJobState reports whether s is a job state.
func ValidJobState(s jobstore.JobState) bool {
	for _, v := range JobStates {
		if s == v {
			return true
		}
	}
	return false
}

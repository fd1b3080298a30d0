package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
)

// JobSummary is a job with counts of its steps, as `warden jobs ls` shows it.
type JobSummary struct {
	*Job
	// StepsDone counts steps in a terminal state (succeeded, failed,
	// skipped, cancelled, dead-lettered).
	StepsDone int `json:"steps_done"`
	// StepsTotal is the number of steps in the spec.
	StepsTotal int `json:"steps_total"`
}

// JobFilter narrows and pages Jobs.
type JobFilter struct {
	// State keeps only jobs in this state; empty keeps all.
	State JobState
	// Limit is the page size: 0 means 50, at most 1,000.
	Limit int
	// Cursor continues a listing: the Next of the page before.
	Cursor string
}

// JobsPage is one page of Jobs, newest job first.
type JobsPage struct {
	Jobs []JobSummary `json:"jobs"`
	// Next continues the listing (JobFilter.Cursor); empty on the last page.
	Next string `json:"next,omitempty"`
}

// Jobs lists one page of jobs, newest first, as `warden jobs ls` does: it
// reads the job records' headers, then only the page's jobs. (It read every
// job and step record the store held, at every call.)
func (c *Client) Jobs(ctx context.Context, f JobFilter) (JobsPage, error) {
	st, err := c.store(ctx)
	if err != nil {
		return JobsPage{}, err
	}
	lf := jobstore.ListFilter{Limit: f.Limit, Cursor: f.Cursor}
	if f.State != "" {
		lf.States = []JobState{f.State}
	}
	p, err := st.List(ctx, c.js, lf)
	if err != nil {
		return JobsPage{}, fmt.Errorf("list jobs: %w", err)
	}
	out := JobsPage{Jobs: make([]JobSummary, 0, len(p.Jobs)), Next: p.Next}
	for _, lj := range p.Jobs {
		if lj.Job == nil {
			continue // its retention ended between the scan and the read
		}
		out.Jobs = append(out.Jobs, JobSummary{Job: redactJob(lj.Job), StepsTotal: len(lj.Job.Spec.Steps), StepsDone: lj.StepsDone()})
	}
	return out, nil
}

// JobDetail is a job with its steps in spec order.
type JobDetail struct {
	Job   *Job    `json:"job"`
	Steps []*Step `json:"steps"`
	// Held is set for a job accepted but not made yet: it has no record
	// (the scheduler writes it when it takes the submission), and Job is
	// built from its submission, pending, with no steps. HeldDelayed: it
	// starts at StartsAt (run_at, delay); HeldQueued: it waits for a
	// scheduler.
	Held Held `json:"held,omitempty"`
	// StartsAt, for a held job, is when it is due.
	StartsAt time.Time `json:"starts_at,omitzero"`
}

// Job reads one job and its steps, without their lease tokens (records.go).
// A job accepted but not made yet (held until its start time, or queued for
// a scheduler) is reported from its submission, with Held set. ErrNotFound
// if there is no such job.
func (c *Client) Job(ctx context.Context, id string) (JobDetail, error) {
	if !protocol.ValidToken(id) {
		return JobDetail{}, fmt.Errorf("job %q: %w", id, ErrNotFound)
	}
	st, err := c.store(ctx)
	if err != nil {
		return JobDetail{}, err
	}
	// One read of the job and its steps (a snapshot), made again by the
	// store while a replica behind the stream's leader answers it.
	snap, err := st.Load(ctx, id)
	if errors.Is(err, jobstore.ErrNotFound) {
		h, herr := c.findHeld(ctx, id)
		switch {
		case errors.Is(herr, jetstream.ErrStreamNotFound):
		case herr != nil:
			return JobDetail{}, herr
		case h != nil:
			if sp, serr := h.spec(c.opts.Limits); serr == nil {
				return h.detail(sp), nil
			}
		default:
			// Not held: it may have become a record since.
			snap, err = st.Load(ctx, id)
		}
	}
	if errors.Is(err, jobstore.ErrNotFound) {
		return JobDetail{}, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return JobDetail{}, err
	}
	d := JobDetail{Job: redactJob(snap.Job), Steps: make([]*Step, 0, len(snap.Steps))}
	for _, s := range snap.Steps {
		d.Steps = append(d.Steps, redactStep(s))
	}
	return d, nil
}

package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/watch"
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

// JobFilter narrows Jobs.
type JobFilter struct {
	// State keeps only jobs in this state; empty keeps all.
	State JobState
}

// Jobs lists jobs, newest first. It reads the store in one pass (one watch
// over job and step keys) rather than one request per job.
func (c *Client) Jobs(ctx context.Context, f JobFilter) ([]JobSummary, error) {
	st, err := c.store(ctx)
	if err != nil {
		return nil, err
	}
	jobs := map[string]*Job{}
	done := map[string]int{}
	err = snapshot(ctx, c.js, st.KV(), []string{"job.*", "step.*.*"}, func(e jetstream.KeyValueEntry) error {
		if strings.HasPrefix(e.Key(), "job.") {
			var j jobstore.Job
			if err := json.Unmarshal(e.Value(), &j); err != nil {
				return fmt.Errorf("decode %s: %w", e.Key(), err)
			}
			jobs[j.ID] = redactJob(&j)
			for _, s := range j.Steps { // a one-step job's step is inline
				if s.State.Terminal() {
					done[j.ID]++
				}
			}
			return nil
		}
		var s jobstore.Step
		if err := json.Unmarshal(e.Value(), &s); err != nil {
			return fmt.Errorf("decode %s: %w", e.Key(), err)
		}
		if s.State.Terminal() {
			done[s.JobID]++
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	out := make([]JobSummary, 0, len(jobs))
	for id, j := range jobs {
		if f.State != "" && j.State != f.State {
			continue
		}
		out = append(out, JobSummary{Job: j, StepsDone: done[id], StepsTotal: len(j.Spec.Steps)})
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.After(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
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
	j, _, err := st.Job(ctx, id)
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
			j, _, err = st.Job(ctx, id)
		}
	}
	if errors.Is(err, jobstore.ErrNotFound) {
		return JobDetail{}, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return JobDetail{}, err
	}
	vs, err := st.Steps(ctx, j)
	if err != nil {
		return JobDetail{}, err
	}
	d := JobDetail{Job: redactJob(j), Steps: make([]*Step, 0, len(vs))}
	for _, s := range vs {
		d.Steps = append(d.Steps, redactStep(s.Step))
	}
	return d, nil
}

// snapshot calls fn with the current value of every key matching filters:
// one full read of internal/watch, stopped once it has been reported.
func snapshot(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, filters []string, fn func(jetstream.KeyValueEntry) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ferr error
	read := false
	w := watch.ForKV(js, kv, watch.Config{Keys: filters, Synced: func(bool) {
		read = true
		cancel()
	}})
	// Run calls back on this goroutine and returns once ctx ends.
	_ = w.Run(ctx, func(e watch.Event) {
		if ferr != nil || read || e.Gone() {
			return
		}
		if ferr = fn(e.Entry); ferr != nil {
			cancel()
		}
	})
	switch {
	case ferr != nil:
		return ferr
	case read:
		return nil
	default:
		return ctx.Err()
	}
}

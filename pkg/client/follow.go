package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Update is one change Follow saw.
type Update struct {
	// Job is the job record, nil until the scheduler has written it.
	Job *Job
	// Steps are the job's steps known so far, in spec order.
	Steps []*Step
	// Step is the step whose record changed, nil when the job record
	// changed or for the initial snapshot.
	Step *Step
	// Initial is true for the first call, made with the state the store
	// held when the watch started.
	Initial bool
}

// Follow watches a job until its record is terminal and returns that final
// record. onUpdate, if not nil, is called (from Follow's goroutine) with the
// initial state and then after every change to the job or one of its steps.
// Records come without their steps' lease tokens (records.go).
//
// A job that does not exist yet is waited for: a submission is accepted
// before the scheduler writes the record. Bound the wait with ctx. A job
// the scheduler rejected (it has no record, and no submission of it is on
// its way) ends the follow with a *RejectedError, as FollowSubmission's
// does: a queued or delayed job that was refused when a scheduler got to
// it was followed for ever.
func (c *Client) Follow(ctx context.Context, jobID string, onUpdate func(Update)) (*Job, error) {
	return c.FollowSubmission(ctx, Receipt{JobID: jobID}, onUpdate)
}

// follow is Follow; while the job has no record it also calls poll every
// rejectionPoll, and ends with poll's error.
func (c *Client) follow(ctx context.Context, jobID string, onUpdate func(Update), poll func(context.Context) error) (*Job, error) {
	if !protocol.ValidToken(jobID) {
		return nil, fmt.Errorf("job %q: %w", jobID, ErrNotFound)
	}
	st, err := c.store(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the watcher's consumer
	w, err := st.KV().WatchFiltered(ctx, []string{protocol.JobKey(jobID), protocol.StepKeysFilter(jobID)})
	if err != nil {
		return nil, fmt.Errorf("watch job %s: %w", jobID, err)
	}
	defer func() { _ = w.Stop() }()

	f := follower{steps: map[string]*Step{}}
	initial := true
	t := time.NewTicker(rejectionPoll)
	defer t.Stop()
	tick := t.C
	for {
		select {
		case <-ctx.Done():
			return f.job, fmt.Errorf("following job %s: %w", jobID, ctx.Err())
		case <-tick:
			if f.job != nil {
				tick = nil // it has a record: nothing left to poll for
				continue
			}
			if err := poll(ctx); err != nil {
				return nil, err
			}
		case e, ok := <-w.Updates():
			if !ok {
				return f.job, fmt.Errorf("following job %s: %w", jobID, ErrWatchClosed)
			}
			if e == nil { // end of the initial values
				initial = false
				if onUpdate != nil {
					onUpdate(Update{Job: f.job, Steps: f.ordered(), Initial: true})
				}
				if f.job != nil && f.job.State.Terminal() {
					return f.job, nil
				}
				continue
			}
			changed, err := f.apply(e)
			if err != nil {
				return f.job, fmt.Errorf("following job %s: %w", jobID, err)
			}
			if initial {
				continue
			}
			if onUpdate != nil {
				onUpdate(Update{Job: f.job, Steps: f.ordered(), Step: changed})
			}
			if f.job != nil && f.job.State.Terminal() {
				return f.job, nil
			}
		}
	}
}

// follower is the picture Follow builds from the watch.
type follower struct {
	job   *Job
	steps map[string]*Step
}

// apply folds one entry in and returns the step it changed, if any.
func (f *follower) apply(e jetstream.KeyValueEntry) (*Step, error) {
	deleted := e.Operation() == jetstream.KeyValueDelete || e.Operation() == jetstream.KeyValuePurge
	if strings.HasPrefix(e.Key(), "job.") {
		if deleted {
			return nil, fmt.Errorf("job record deleted: %w", ErrNotFound)
		}
		var j jobstore.Job
		if err := json.Unmarshal(e.Value(), &j); err != nil {
			return nil, fmt.Errorf("decode %s: %w", e.Key(), err)
		}
		f.job = redactJob(&j)
		// A one-step job keeps its step inside the job record.
		var changed *jobstore.Step
		for _, st := range f.job.Steps {
			old := f.steps[st.ID]
			if old == nil || old.State != st.State || old.Epoch != st.Epoch || !old.UpdatedAt.Equal(st.UpdatedAt) {
				changed = st
			}
			f.steps[st.ID] = st
		}
		return changed, nil
	}
	if deleted {
		return nil, nil
	}
	var s jobstore.Step
	if err := json.Unmarshal(e.Value(), &s); err != nil {
		return nil, fmt.Errorf("decode %s: %w", e.Key(), err)
	}
	v := redactStep(&s)
	f.steps[s.ID] = v
	return v, nil
}

// ordered returns the steps in spec order once the job is known, by id
// before that.
func (f *follower) ordered() []*Step {
	out := make([]*Step, 0, len(f.steps))
	if f.job != nil {
		for _, sp := range f.job.Spec.Steps {
			if s, ok := f.steps[sp.ID]; ok {
				out = append(out, s)
			}
		}
		if len(out) == len(f.steps) {
			return out
		}
		out = out[:0]
	}
	for _, s := range f.steps {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// rejectionPoll is how often FollowSubmission looks for the scheduler's
// rejection of the submission while its job has no record.
const rejectionPoll = time.Second

// FollowSubmission is Follow for the job of a submission just made (r, from
// Submit). While the job has no record it also looks for the scheduler's
// rejection of this very submission (a submission_rejected event naming
// r's stream sequence) and returns it as a *RejectedError. A caller whose
// wait for the scheduler's reply ran out (no scheduler was up) would
// otherwise follow, forever, a job the scheduler later refused. A job that
// starts later (r.StartsAt) is submitted again at its start time, with a
// later stream sequence, and the scheduler checks it again then (a rate
// limit it names may be gone): a rejection of the job with a later
// sequence ends the follow too, once nothing of the job is left — no
// record, no submission on its way (a resubmission of the same id may be
// rejected while this one still waits). Without r.Sequence (Follow), only
// such a rejection counts. A caller that may not read WARDEN_EVENTS only
// follows.
func (c *Client) FollowSubmission(ctx context.Context, r Receipt, onUpdate func(Update)) (*Job, error) {
	var events jetstream.Stream // looked up once
	return c.follow(ctx, r.JobID, onUpdate, func(ctx context.Context) error {
		if events == nil {
			s, err := c.js.Stream(ctx, protocol.StreamEvents)
			if err != nil {
				return nil // no events to read (no permission): Follow alone
			}
			events = s
		}
		rej, exact := rejectionOf(ctx, events, r)
		if rej == nil || exact {
			return rej
		}
		if h, err := c.findHeld(ctx, r.JobID); err != nil || h != nil {
			return nil // still on its way (or no answer): follow on
		}
		if st, err := c.store(ctx); err != nil {
			return nil
		} else if _, _, err := st.Job(ctx, r.JobID); !errors.Is(err, jobstore.ErrNotFound) {
			return nil // made meanwhile (the watch reports it)
		}
		return rej
	})
}

// rejectionOf returns the scheduler's latest rejection of r's job, if there
// is one it can read that may be r's: exact when it names r's stream
// sequence, else one of a later submission of the job (its release, for a
// job that starts later).
func rejectionOf(ctx context.Context, s jetstream.Stream, r Receipt) (rej error, exact bool) {
	m, err := s.GetLastMsgForSubject(ctx, protocol.EventSubject(protocol.EventSubmissionRejected, r.JobID))
	if err != nil {
		return nil, false
	}
	var e protocol.Event
	if json.Unmarshal(m.Data, &e) != nil {
		return nil, false
	}
	seq, err := strconv.ParseUint(e.Data["stream_seq"], 10, 64)
	switch {
	case err != nil:
		return nil, false
	case seq == r.Sequence:
		return &RejectedError{JobID: r.JobID, Reason: e.Reason}, true
	case seq > r.Sequence:
		return &RejectedError{JobID: r.JobID, Reason: e.Reason}, false
	}
	return nil, false
}

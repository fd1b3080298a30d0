package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// Held says where the submission of an accepted job that has no record yet
// waits (JobDetail.Held). The scheduler writes a job's record when it
// takes the submission: for a job with run_at or delay, at its start time.
type Held string

const (
	// HeldDelayed: the scheduler holds the submission in WARDEN_DELAY (a
	// message schedule on warden.delay.<job>) until JobDetail.StartsAt.
	HeldDelayed Held = "delayed"
	// HeldQueued: the submission is due and waits for a scheduler, in
	// WARDEN_SUBMIT or, just released from its delay, in WARDEN_DELAY.
	HeldQueued Held = "queued"
)

// held is an accepted submission of a job the store has no record of.
type held struct {
	job   string
	where Held
	msg   *jetstream.RawStreamMsg
	// startsAt is when the job is due; zero when it is due now. For a
	// queued submission it comes from its spec, parsed once by spec.
	startsAt time.Time
	found    time.Time // when it was looked up
}

// findHeld looks for an accepted submission of job that no scheduler has
// made into a record yet: queued in WARDEN_SUBMIT, held on
// warden.delay.<job>, released on warden.delayed.<job>, queued again (the
// release submitted). A submission moves through these in that order, and
// each step writes the next place before it leaves the last (the record
// too: a scheduler writes it before it acks the submission), so looking in
// that order, and at the record after, cannot miss one that moves on
// meanwhile. It returns nil, nil if there is none, and an error when it
// could not look (the streams are missing, no permission, no answer). A
// submission on the bare warden.submit names its job only in a header and
// is not found.
func (c *Client) findHeld(ctx context.Context, job string) (*held, error) {
	submit, err := c.js.Stream(ctx, protocol.StreamSubmit)
	if err != nil {
		return nil, fmt.Errorf("look for job %s's submission: %w", job, err)
	}
	delay, err := c.js.Stream(ctx, protocol.StreamDelay)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		delay = nil // a deployment without delayed jobs
	} else if err != nil {
		return nil, fmt.Errorf("look for job %s's submission: %w", job, err)
	}
	queued := protocol.SubjectSubmit + ".*." + job // warden.submit.<p>.<job>
	places := []struct {
		s       jetstream.Stream
		subject string
	}{{submit, queued}, {delay, protocol.DelaySubject(job)}, {delay, protocol.DelayedSubject(job)}, {submit, queued}}
	for _, p := range places {
		if p.s == nil {
			continue
		}
		m, err := p.s.GetLastMsgForSubject(ctx, p.subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("look for job %s's submission in %s: %w", job, p.s.CachedInfo().Config.Name, err)
		}
		return heldFrom(job, m, time.Now()), nil
	}
	return nil, nil
}

// heldFrom says when a held submission is due: a delayed one at its
// message schedule's time, one released from its delay now, and one still
// queued at its spec's start time counted from when it was stored (as the
// scheduler counts it; spec reads it, as it parses the spec anyway).
func heldFrom(job string, m *jetstream.RawStreamMsg, now time.Time) *held {
	h := &held{job: job, msg: m, where: HeldQueued, found: now}
	if strings.HasPrefix(m.Subject, protocol.SubjectDelayPrefix+".") {
		if at, ok := scheduledAt(m.Header.Get(protocol.HeaderNatsSchedule)); ok {
			h.due(at)
		}
	}
	return h
}

// due records that the held job starts at at: delayed if that is still to
// come when it was looked up.
func (h *held) due(at time.Time) {
	if at.After(h.found) {
		h.where, h.startsAt = HeldDelayed, at
	}
}

// scheduledAt reads a one-shot message schedule's time ("@at <RFC 3339>").
func scheduledAt(v string) (time.Time, bool) {
	s, ok := strings.CutPrefix(v, "@at ")
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	return t, err == nil
}

// spec parses the held submission as the scheduler will, and checks that it
// names job as the scheduler requires (parseSubmission): a submission it
// would reject is no job.
func (h *held) spec(limits spec.Limits) (*spec.Job, error) {
	limits.Accepted = schedule.Released(h.msg.Header) // as the scheduler parses it (limitsFor)
	sp, err := spec.Parse(h.msg.Data, limits)
	if err != nil {
		return nil, err
	}
	if h.where == HeldQueued && !strings.HasPrefix(h.msg.Subject, protocol.SubjectDelayedPrefix+".") && !schedule.Released(h.msg.Header) {
		h.due(sp.StartAt(h.msg.Time)) // still queued, not released from a delay
	}
	if id := h.msg.Header.Get(protocol.HeaderJobID); id != "" && id != h.job {
		return nil, fmt.Errorf("its %s header names job %s", protocol.HeaderJobID, id)
	}
	if sp.IdempotencyKey != "" && protocol.JobIDForKey(sp.IdempotencyKey) != h.job {
		return nil, fmt.Errorf("its idempotency_key names job %s", protocol.JobIDForKey(sp.IdempotencyKey))
	}
	return sp, nil
}

// detail is the held job as Job reports it: pending, built from its
// submission, without steps (none is materialised).
func (h *held) detail(sp *spec.Job) JobDetail {
	return JobDetail{Job: h.record(sp), Steps: []*Step{}, Held: h.where, StartsAt: h.startsAt}
}

// record is the held job's record as accepted: created when it was
// submitted, without a deadline (its timeout starts when it does, and a
// held job cancelled never starts).
func (h *held) record(sp *spec.Job) *jobstore.Job {
	j := jobstore.NewJob(h.job, *sp, h.msg.Time.UTC())
	j.Deadline = time.Time{}
	return j
}

// cancelHeld cancels an accepted job that has no record yet, by creating
// its records already ended cancelled: the scheduler that takes its
// submission later (at its start time, or when one runs) fails to create
// the job, reads it, finds it ended and runs nothing. The submission is
// left where it is: WARDEN_DELAY is the schedulers' (docs/security.md; the
// admin role may not delete from it), so the records are kept until the
// job's start time plus the retention, and the release finds them. It
// returns the steps cancelled; jobstore.ErrExists if a scheduler created
// the job first (cancel that one), ErrNotFound if there is no such job.
func (c *Client) cancelHeld(ctx context.Context, store *jobstore.Store, jobID string, compensate bool) ([]string, error) {
	h, err := c.findHeld(ctx, jobID)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("job %s: %w", jobID, ErrNotFound)
	case err != nil:
		return nil, err
	case h == nil:
		// It may have become a record since the caller looked.
		if _, _, err := store.Job(ctx, jobID); err == nil {
			return nil, jobstore.ErrExists
		}
		return nil, fmt.Errorf("job %s: %w", jobID, ErrNotFound)
	}
	sp, err := h.spec(c.opts.Limits)
	if err != nil {
		return nil, fmt.Errorf("job %s: %w (its submission waits, but the scheduler will reject it: %v)", jobID, ErrNotFound, err)
	}
	if hook := testHookHeld.Load(); hook != nil {
		(*hook)(jobID)
	}
	now := time.Now().UTC()
	created := h.msg.Time.UTC()
	j := h.record(sp)
	steps, err := jobstore.NewSteps(jobID, *sp, jobstore.StepDefaults{}, created)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(steps))
	for _, st := range steps {
		st.Desired, st.State = jobstore.StepCancelled, jobstore.StepCancelled
		st.LastError = protocol.ErrorCancelled + " by an operator before the job started"
		st.UpdatedAt, st.FinishedAt = now, now
		ids = append(ids, st.ID)
	}
	j.Desired, j.State = jobstore.JobCancelled, jobstore.JobCancelled
	j.UpdatedAt, j.FinishedAt = now, now
	j.CompensateOnCancel = compensate
	j.Inline = len(steps) == 1
	if j.Inline {
		j.Steps = steps
	}
	ttl := heldRetention(store.Retention(), h.startsAt, now)
	// The job record first: its create is the compare-and-set against the
	// scheduler's (which also writes the job record before its steps).
	b := store.Batch()
	b.Add(store.JobWrite(j, 0).WithTTL(ttl))
	if r := b.Wait(ctx)[0]; r.Err != nil {
		return nil, r.Err
	}
	if j.Inline {
		return ids, nil
	}
	b = store.Batch()
	for _, st := range steps {
		b.Add(store.EndedStepWrite(st, 0).WithTTL(ttl))
	}
	for _, r := range b.Wait(ctx) {
		if r.Err != nil && !errors.Is(r.Err, jobstore.ErrExists) {
			return ids, fmt.Errorf("job %s is cancelled, but not all its step records were written: %w", jobID, r.Err)
		}
	}
	return ids, nil
}

// heldRetention is how long the records of a job cancelled before its
// start are kept: the retention, counted from its start time, when the
// server releases its submission and a scheduler must find them. Zero
// (no TTL) when finished jobs are kept for ever.
func heldRetention(retention time.Duration, startsAt, now time.Time) time.Duration {
	if retention <= 0 {
		return 0
	}
	if startsAt.After(now) {
		retention += startsAt.Sub(now)
	}
	return retention.Truncate(time.Second) + time.Second
}

// testHookHeld, if set (export_test.go), runs between finding a held
// submission and creating its cancelled records.
var testHookHeld atomic.Pointer[func(job string)]

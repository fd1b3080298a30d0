package dlq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// ErrNotFound: no dead letter with that id.
var ErrNotFound = errors.New("dead letter not found")

// ErrWrongState: the step or job is not in a state the action applies to
// (a retry of a step that is no longer dead-lettered, say).
var ErrWrongState = errors.New("wrong state")

// ErrNotRetriable: the dead letter names no step (its task could not be
// decoded, so its job and step are unknown); it can only be purged. It
// matches ErrWrongState too: the CLI answers it as a usage error (exit 2),
// never as "NATS unavailable".
var ErrNotRetriable = fmt.Errorf("%w: dead letter names no step", ErrWrongState)

// NotRetriableError is Retry's error for a letter that names no step.
type NotRetriableError struct {
	ID      uint64
	Subject string
	Reason  string
}

func (e *NotRetriableError) Error() string {
	return fmt.Sprintf("dead letter %d on %s (reason %s) names no job and step: it cannot be retried, only purged",
		e.ID, e.Subject, e.Reason)
}

// Unwrap makes errors.Is(err, ErrNotRetriable) and ErrWrongState hold.
func (e *NotRetriableError) Unwrap() error { return ErrNotRetriable }

// Letter is one dead letter. ID is its sequence in WARDEN_DLQ.
type Letter struct {
	ID         uint64              `json:"id"`
	Subject    string              `json:"subject"`
	Time       time.Time           `json:"time"`
	JobID      string              `json:"job_id"`
	StepID     string              `json:"step_id"`
	Epoch      string              `json:"epoch"`
	Reason     string              `json:"reason"`
	Detail     string              `json:"detail"`
	Deliveries string              `json:"deliveries"`
	LastError  string              `json:"last_error,omitempty"`
	Headers    map[string][]string `json:"headers"`
	Payload    json.RawMessage     `json:"payload"`
}

func fromRaw(raw *jetstream.RawStreamMsg) Letter {
	h := raw.Header
	l := Letter{
		ID: raw.Sequence, Subject: raw.Subject, Time: raw.Time,
		JobID: h.Get(protocol.HeaderJob), StepID: h.Get(protocol.HeaderStep), Epoch: h.Get(protocol.HeaderEpoch),
		Reason: h.Get(protocol.HeaderDLQReason), Detail: h.Get(protocol.HeaderDLQDetail),
		Deliveries: h.Get(protocol.HeaderDLQDeliveries), LastError: h.Get(protocol.HeaderDLQLastError),
		Headers: map[string][]string(h),
	}
	if json.Valid(raw.Data) {
		l.Payload = raw.Data
	} else {
		b, _ := json.Marshal(string(raw.Data))
		l.Payload = b
	}
	return l
}

// Queue is the dead-letter stream.
type Queue struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
}

// Open binds to WARDEN_DLQ.
func Open(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) (*Queue, error) {
	s, err := js.Stream(ctx, protocol.StreamDLQ)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", protocol.StreamDLQ, err)
	}
	return &Queue{nc: nc, js: js, stream: s}, nil
}

// List returns up to limit dead letters, oldest first.
func (q *Queue) List(ctx context.Context, limit int) ([]Letter, error) {
	var out []Letter
	for seq := uint64(1); limit <= 0 || len(out) < limit; {
		raw, err := q.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(protocol.SubjectDLQPrefix+".>"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read dead letters: %w", err)
		}
		out = append(out, fromRaw(raw))
		seq = raw.Sequence + 1
	}
	return out, nil
}

// Get returns one dead letter.
func (q *Queue) Get(ctx context.Context, id uint64) (Letter, error) {
	raw, err := q.stream.GetMsg(ctx, id)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Letter{}, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	if err != nil {
		return Letter{}, err
	}
	return fromRaw(raw), nil
}

// Purge removes every dead letter and returns how many there were.
func (q *Queue) Purge(ctx context.Context) (uint64, error) {
	info, err := q.stream.Info(ctx)
	if err != nil {
		return 0, err
	}
	if err := q.stream.Purge(ctx); err != nil {
		return 0, fmt.Errorf("purge dead letters: %w", err)
	}
	return info.State.Msgs, nil
}

// Retry brings a dead-lettered step back (see the package doc). It fails if
// the step is no longer dead-lettered, so a retry happens once.
func (q *Queue) Retry(ctx context.Context, store *jobstore.Store, id uint64) (Letter, error) {
	l, err := q.Get(ctx, id)
	if err != nil {
		return l, err
	}
	if !protocol.ValidToken(l.JobID) || !protocol.ValidToken(l.StepID) {
		return l, &NotRetriableError{ID: id, Subject: l.Subject, Reason: l.Reason}
	}
	// Only a step still dead-lettered: a letter stays listed after its step
	// moved on (warden job retry reopened it, it then failed or was
	// cancelled with its job), and reopening such a step brought a
	// cancelled job back to running.
	if err := reopen(ctx, store, l.JobID, l.StepID, time.Now().UTC(), jobstore.StepDeadLettered); err != nil {
		return l, err
	}
	Kick(ctx, q.nc, l.JobID)
	if err := streams.DeleteMsg(ctx, q.stream, id); err != nil {
		return l, fmt.Errorf("step reopened, but deleting dead letter %d failed: %w", id, err)
	}
	return l, nil
}

// Reopen puts a dead-lettered, failed or cancelled step back to pending with a fresh
// attempt budget, and reopens its job and the steps skipped in its wake.
func Reopen(ctx context.Context, store *jobstore.Store, jobID, stepID string, now time.Time) error {
	return reopen(ctx, store, jobID, stepID, now, jobstore.StepDeadLettered, jobstore.StepFailed, jobstore.StepCancelled)
}

// reopen is Reopen for a step in one of the states from.
func reopen(ctx context.Context, store *jobstore.Store, jobID, stepID string, now time.Time, from ...jobstore.StepState) error {
	if err := refuseUndone(ctx, store, jobID); err != nil {
		return err
	}
	for range 8 {
		st, rev, err := store.Step(ctx, jobID, stepID)
		if err != nil {
			return err
		}
		if !slices.Contains(from, st.State) {
			return fmt.Errorf("%w: step %s.%s is %s, not %v", ErrWrongState, jobID, stepID, st.State, from)
		}
		st.State, st.Desired, st.Actor, st.LockedUntil, st.FinishedAt = jobstore.StepPending, jobstore.StepSucceeded, "", time.Time{}, time.Time{}
		st.Attempt, st.ErrorCount, st.Recoveries = 0, 0, 0
		st.LastError = "reopened by an operator after: " + st.LastError
		st.UpdatedAt = now
		if _, err := store.UpdateStep(ctx, st, rev); errors.Is(err, jobstore.ErrConflict) {
			continue
		} else if err != nil {
			return err
		}
		if err := ReopenJob(ctx, store, jobID, now); err != nil {
			return fmt.Errorf("step %s.%s reopened, but not its job (retry the job to finish it): %w", jobID, stepID, err)
		}
		return nil
	}
	return jobstore.ErrConflict
}

// refuseUndone refuses to reopen a step of a job whose compensation ran
// (or runs): the completed steps' effects were undone, and compensation is
// planned once per job, so a reopened forward step would run beside the
// undo (compensation_failed) or end the job succeeded with its work undone
// (compensated). Such a job is submitted again instead.
func refuseUndone(ctx context.Context, store *jobstore.Store, jobID string) error {
	job, _, err := store.Job(ctx, jobID)
	if err != nil {
		return err
	}
	if job.State.Compensation() {
		return fmt.Errorf("%w: job %s is %s: its completed steps were undone, so its steps cannot be reopened; submit the job again",
			ErrWrongState, jobID, job.State)
	}
	return nil
}

// ReopenJob reopens the job of a reopened step: skipped steps pending
// again, ended steps written again without their retention TTL, the job
// running. Reopen calls it after the step; a reopen whose step landed and
// whose job write did not left a finished job with a pending step, and a
// job retry finishes it by calling this again (ops.RetryJob).
func ReopenJob(ctx context.Context, store *jobstore.Store, jobID string, now time.Time) error {
	for range 8 {
		job, rev, err := store.Job(ctx, jobID)
		if err != nil {
			return err
		}
		steps, err := store.Steps(ctx, job)
		if err != nil {
			return err
		}
		conflict := false
		for _, s := range steps {
			skipped := s.State == jobstore.StepSkipped
			switch {
			case skipped:
				// Evaluate skips it again if another dependency still failed.
				s.State, s.FinishedAt, s.LastError, s.UpdatedAt = jobstore.StepPending, time.Time{}, "", now
			case s.State.Terminal() && !job.Inline:
				// Written as it is, without the retention TTL its job's end
				// gave it (jobstore.StepWrite): a job reopened near its
				// retention lost its succeeded steps' records while it ran
				// again (the scheduler then took them for steps never
				// created, and ran them again). The job's next end gives it
				// back.
			default:
				continue
			}
			if _, err := store.UpdateStep(ctx, s.Step, s.Revision); err != nil {
				if !errors.Is(err, jobstore.ErrConflict) {
					return err
				}
				// Someone else wrote the step meanwhile (a scheduler ending
				// or sealing the job). A skipped one is read again: left
				// skipped it would never run while the job, reopened,
				// could end succeeded. An ended one's TTL the scheduler
				// takes back itself (unseal) once the job is open again.
				conflict = conflict || skipped
			}
		}
		if conflict {
			continue
		}
		// Written even when the job is open: one whose steps had all ended
		// may be writing its terminal record (sealing), and that write must
		// lose its compare-and-set and read the reopened step, not end the
		// job over it.
		if job.State.Terminal() || job.Desired != jobstore.JobSucceeded {
			job.State, job.Desired, job.Error, job.FinishedAt = jobstore.JobRunning, jobstore.JobSucceeded, "", time.Time{}
		}
		job.UpdatedAt = now
		if _, err := store.UpdateJob(ctx, job, rev); errors.Is(err, jobstore.ErrConflict) {
			continue
		} else if err != nil {
			return err
		}
		return nil
	}
	return jobstore.ErrConflict
}

// Kick asks a scheduler to advance a job now. It is best effort: without a
// scheduler, the supervisor leader advances the job after its grace period.
func Kick(ctx context.Context, nc *nats.Conn, jobID string) {
	kctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, _ = nc.RequestWithContext(kctx, protocol.SubjectControlAdvance, []byte(jobID))
}

// ParseID parses a dead letter id.
func ParseID(s string) (uint64, error) {
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 {
		return 0, fmt.Errorf("dead letter id must be a positive number, got %q", s)
	}
	return id, nil
}

package dlq

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
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

// Letter is one dead letter. ID is its sequence in WARDEN_DLQ. It is a
// view: Headers and Payload are the stored message's, less the task's lease
// token (see fromRaw).
type Letter struct {
	ID      uint64    `json:"id"`
	Subject string    `json:"subject"`
	Time    time.Time `json:"time"`
	Parked
	Headers map[string][]string `json:"headers"`
	Payload json.RawMessage     `json:"payload"`
}

// Parked is what a letter's headers say about it: its job, step and
// epoch, and why, how and after how many deliveries it was parked.
type Parked struct {
	JobID      string `json:"job_id"`
	StepID     string `json:"step_id"`
	Epoch      string `json:"epoch"`
	Reason     string `json:"reason"`
	Detail     string `json:"detail"`
	Deliveries string `json:"deliveries"`
	LastError  string `json:"last_error,omitempty"`
}

// fromRaw makes the view of a stored letter. A letter is a copy of a task:
// its Warden-Token header and its body's "token" carry the dispatch's lease
// token, which only the scheduler and the agent holding the task may know
// (a result's Nats-Msg-Id contains it: whoever knows it can take that id
// first, and the genuine result is dropped as a duplicate). The step may
// still hold that token: a letter is stored before its step is marked, and
// withdrawn if a result wins the race. Neither is in the view, which
// operators, the HTTP API and the readonly identity read.
func fromRaw(raw *jetstream.RawStreamMsg) Letter {
	h := raw.Header
	l := Letter{ID: raw.Sequence, Subject: raw.Subject, Time: raw.Time, Parked: parked(h), Headers: make(map[string][]string, len(h))}
	for k, v := range h {
		if !strings.EqualFold(k, protocol.HeaderToken) {
			l.Headers[k] = v
		}
	}
	if json.Valid(raw.Data) {
		l.Payload = withoutToken(raw.Data)
	} else {
		b, _ := json.Marshal(string(raw.Data))
		l.Payload = b
	}
	return l
}

// parked reads a letter's headers.
func parked(h nats.Header) Parked {
	return Parked{JobID: h.Get(protocol.HeaderJob), StepID: h.Get(protocol.HeaderStep), Epoch: h.Get(protocol.HeaderEpoch),
		Reason: h.Get(protocol.HeaderDLQReason), Detail: h.Get(protocol.HeaderDLQDetail),
		Deliveries: h.Get(protocol.HeaderDLQDeliveries), LastError: h.Get(protocol.HeaderDLQLastError)}
}

// withoutToken returns the JSON document data less the top-level members
// named token (in any case: encoding/json would read "Token" into a task's
// token too), the others in their order; data itself when it is not an
// object or has no such member.
func withoutToken(data []byte) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return data
	}
	out, found := []byte{'{'}, false
	for dec.More() {
		t, err := dec.Token()
		key, ok := t.(string)
		if err != nil || !ok {
			return data
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return data
		}
		if strings.EqualFold(key, "token") {
			found = true
			continue
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		k, _ := json.Marshal(key)
		out = append(append(append(out, k...), ':'), v...)
	}
	if !found {
		return data
	}
	return append(out, '}')
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
// the step is no longer dead-lettered, so a retry happens once, and if its
// job is cancelled or being cancelled (*JobCancelledError): a dead-letter
// retry never undoes a cancel.
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
	// cancelled job back to running. Nor a step of a job cancelled or
	// being cancelled (JobCancelledError): the retry undid the cancel.
	reopened, err := reopen(ctx, store, reopenRequest{
		job: l.JobID, step: l.StepID, from: []jobstore.StepState{jobstore.StepDeadLettered}, keepCancel: true,
	}, time.Now().UTC())
	if len(reopened) > 0 {
		// Whatever landed runs (or, in a job cancelled meanwhile, is
		// cancelled) now, not after the supervisor's grace.
		Kick(context.WithoutCancel(ctx), q.nc, l.JobID)
	}
	if err != nil {
		return l, err
	}
	if err := streams.DeleteMsg(ctx, q.stream, id); err != nil {
		return l, fmt.Errorf("step reopened, but deleting dead letter %d failed: %w", id, err)
	}
	return l, nil
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

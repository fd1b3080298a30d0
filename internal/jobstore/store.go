package jobstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Errors callers branch on.
var (
	// ErrNotFound: no such job or step.
	ErrNotFound = errors.New("not found")
	// ErrExists: the record already exists (Create lost, or a resubmission).
	ErrExists = errors.New("already exists")
	// ErrConflict: the record changed since it was read (CAS lost).
	ErrConflict = errors.New("revision conflict")
	// ErrUndecodable: a record is not one (written by hand, or by a
	// version that wrote another shape).
	ErrUndecodable = errors.New("undecodable record")
)

// DefaultRetention is how long a finished job's records are kept.
const DefaultRetention = 7 * 24 * time.Hour

// Store reads and writes job and step records.
//
// Writes are JetStream publishes to the bucket's subjects, not KV API calls,
// so that every record carries the protocol.HeaderRecord* headers (listings
// and the supervisor read headers only), a terminal record carries its
// retention TTL, and a caller can pipeline writes (Batch).
type Store struct {
	kv        jetstream.KeyValue
	js        jetstream.JetStream
	nc        *nats.Conn
	stream    string
	retention time.Duration
	// index answers List while it is current (UseIndex); nil: List scans.
	index atomic.Pointer[Index]
}

// Option customises a Store.
type Option func(*Store)

// WithRetention sets how long finished jobs are kept (default 7 days; 0 or
// less keeps them forever).
func WithRetention(d time.Duration) Option { return func(s *Store) { s.retention = d } }

// Open binds to the job store bucket, which streams.Ensure creates.
func Open(ctx context.Context, js jetstream.JetStream, opts ...Option) (*Store, error) {
	kv, err := js.KeyValue(ctx, protocol.BucketJobs)
	if err != nil {
		return nil, fmt.Errorf("open job store %s: %w", protocol.BucketJobs, err)
	}
	s := &Store{kv: kv, js: js, nc: js.Conn(), stream: "KV_" + protocol.BucketJobs, retention: DefaultRetention}
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// KV exposes the bucket for watchers.
func (s *Store) KV() jetstream.KeyValue { return s.kv }

// Retention is how long finished jobs are kept.
func (s *Store) Retention() time.Duration { return s.retention }

// CreateJob writes a new job record (with its steps when inline);
// ErrExists if the id is taken.
func (s *Store) CreateJob(ctx context.Context, j *Job) (uint64, error) {
	return s.write(ctx, s.JobWrite(j, 0))
}

// Job reads a job record and its revision. An inline job's steps are in
// j.Steps.
func (s *Store) Job(ctx context.Context, id string) (*Job, uint64, error) {
	e, err := s.getLast(ctx, protocol.JobKey(id))
	if err != nil {
		return nil, 0, err
	}
	j, err := jobOf(e)
	if err != nil {
		return nil, 0, err
	}
	return j, e.rev, nil
}

// UpdateJob writes j if the record is still at rev; ErrConflict otherwise.
func (s *Store) UpdateJob(ctx context.Context, j *Job, rev uint64) (uint64, error) {
	return s.write(ctx, s.JobWrite(j, rev))
}

// CreateStep writes a new step record; ErrExists if it is already there.
func (s *Store) CreateStep(ctx context.Context, st *Step) (uint64, error) {
	return s.write(ctx, s.StepWrite(st, 0))
}

// Step reads a step record and its revision: for a step of an inline job,
// the job record's revision (writing the step rewrites that record).
func (s *Store) Step(ctx context.Context, job, step string) (*Step, uint64, error) {
	got, err := s.multiLast(ctx, []string{protocol.JobKey(job), protocol.StepKey(job, step)})
	if err != nil {
		return nil, 0, err
	}
	if e, ok := got[protocol.StepKey(job, step)]; ok {
		return stepOf(e)
	}
	if e, ok := got[protocol.JobKey(job)]; ok {
		j, err := jobOf(e)
		if err != nil {
			return nil, 0, err
		}
		if j.Inline {
			if st := j.Step(step); st != nil {
				return st, e.rev, nil
			}
			return nil, 0, fmt.Errorf("get %s: %w", protocol.StepKey(job, step), ErrNotFound) // the job has no such step
		}
		// A replica may hold the job record and not yet the step's: the
		// leader's is read.
		e, err := s.leaderLast(ctx, protocol.StepKey(job, step))
		if err != nil {
			return nil, 0, err
		}
		return stepOf(e)
	}
	// Neither record here: the leader is asked about the job's, which every
	// job has (an inline job has no step record to ask about, and asking
	// for one said "not found" for a job a lagging replica had not stored).
	return nil, 0, s.missing(ctx, protocol.JobKey(job))
}

// stepOf decodes a step record.
func stepOf(e entry) (*Step, uint64, error) {
	var st Step
	if err := json.Unmarshal(e.data, &st); err != nil {
		return nil, 0, fmt.Errorf("%w %s: %w", ErrUndecodable, e.key, err)
	}
	return &st, e.rev, nil
}

// UpdateStep writes st if its record is still at rev; ErrConflict otherwise.
// For a step of an inline job this rewrites the job record.
func (s *Store) UpdateStep(ctx context.Context, st *Step, rev uint64) (uint64, error) {
	if !st.inline {
		return s.write(ctx, s.StepWrite(st, rev))
	}
	e, err := s.getLast(ctx, protocol.JobKey(st.JobID))
	if err != nil {
		return 0, err
	}
	if e.rev != rev {
		return 0, fmt.Errorf("update %s at revision %d: %w", protocol.JobKey(st.JobID), rev, ErrConflict)
	}
	j, err := jobOf(e)
	if err != nil {
		return 0, err
	}
	if !j.ReplaceStep(st) {
		return 0, fmt.Errorf("update %s: %w", protocol.StepKey(st.JobID, st.ID), ErrNotFound)
	}
	return s.write(ctx, s.JobWrite(j, rev))
}

// VersionedStep is a step with the revision it was read at.
type VersionedStep struct {
	*Step
	Revision uint64
}

// Steps reads the steps of a job in spec order, in one request. A step not
// yet materialised is missing from the result.
func (s *Store) Steps(ctx context.Context, j *Job) ([]VersionedStep, error) {
	snap, err := s.Load(ctx, j.ID)
	if err != nil {
		return nil, err
	}
	return snap.Versioned(), nil
}

// JobIDs lists the ids of every job in the store.
func (s *Store) JobIDs(ctx context.Context) ([]string, error) {
	l, err := s.kv.ListKeysFiltered(ctx, protocol.JobKey("*"))
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	var ids []string
	for k := range l.Keys() {
		ids = append(ids, strings.TrimPrefix(k, protocol.JobKey("")))
	}
	return ids, nil
}

// Step returns the inline step with this id, or nil.
func (j *Job) Step(id string) *Step {
	for _, st := range j.Steps {
		if st.ID == id {
			return st
		}
	}
	return nil
}

// ReplaceStep puts st in place of the inline step with its id.
func (j *Job) ReplaceStep(st *Step) bool {
	for i, old := range j.Steps {
		if old.ID == st.ID {
			j.Steps[i] = st
			return true
		}
	}
	return false
}

// jobOf decodes a job record (ErrUndecodable if it is not one).
func jobOf(e entry) (*Job, error) {
	var j Job
	if err := json.Unmarshal(e.data, &j); err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrUndecodable, e.key, err)
	}
	for _, st := range j.Steps {
		st.inline = true
		if st.JobID == "" {
			st.JobID = j.ID
		}
	}
	return &j, nil
}

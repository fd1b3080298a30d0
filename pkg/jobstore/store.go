package jobstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

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
)

// Store reads and writes job and step records.
type Store struct {
	kv jetstream.KeyValue
}

// Open binds to the job store bucket, which streams.Ensure creates.
func Open(ctx context.Context, js jetstream.JetStream) (*Store, error) {
	kv, err := js.KeyValue(ctx, protocol.BucketJobs)
	if err != nil {
		return nil, fmt.Errorf("open job store %s: %w", protocol.BucketJobs, err)
	}
	return &Store{kv: kv}, nil
}

// KV exposes the bucket for watchers.
func (s *Store) KV() jetstream.KeyValue { return s.kv }

// CreateJob writes a new job record; ErrExists if the id is taken.
func (s *Store) CreateJob(ctx context.Context, j *Job) (uint64, error) {
	return s.create(ctx, protocol.JobKey(j.ID), j)
}

// Job reads a job record and its revision.
func (s *Store) Job(ctx context.Context, id string) (*Job, uint64, error) {
	var j Job
	rev, err := s.get(ctx, protocol.JobKey(id), &j)
	if err != nil {
		return nil, 0, err
	}
	return &j, rev, nil
}

// UpdateJob writes j if the record is still at rev; ErrConflict otherwise.
func (s *Store) UpdateJob(ctx context.Context, j *Job, rev uint64) (uint64, error) {
	return s.update(ctx, protocol.JobKey(j.ID), j, rev)
}

// CreateStep writes a new step record; ErrExists if it is already there.
func (s *Store) CreateStep(ctx context.Context, st *Step) (uint64, error) {
	return s.create(ctx, protocol.StepKey(st.JobID, st.ID), st)
}

// Step reads a step record and its revision.
func (s *Store) Step(ctx context.Context, job, step string) (*Step, uint64, error) {
	var st Step
	rev, err := s.get(ctx, protocol.StepKey(job, step), &st)
	if err != nil {
		return nil, 0, err
	}
	return &st, rev, nil
}

// UpdateStep writes st if the record is still at rev; ErrConflict otherwise.
func (s *Store) UpdateStep(ctx context.Context, st *Step, rev uint64) (uint64, error) {
	return s.update(ctx, protocol.StepKey(st.JobID, st.ID), st, rev)
}

// VersionedStep is a step with the revision it was read at.
type VersionedStep struct {
	*Step
	Revision uint64
}

// Steps reads the steps of a job in spec order. A step not yet materialised
// is missing from the result.
//
// The reads go out concurrently (at most stepReadConcurrency at once): a job
// is advanced after every result, so for a fan-out of n steps sequential
// reads would cost n round trips each time, n² in all.
func (s *Store) Steps(ctx context.Context, j *Job) ([]VersionedStep, error) {
	n := len(j.Spec.Steps)
	got := make([]VersionedStep, n)
	errs := make([]error, n)
	if n == 1 {
		st, rev, err := s.Step(ctx, j.ID, j.Spec.Steps[0].ID)
		got[0], errs[0] = VersionedStep{Step: st, Revision: rev}, err
	} else {
		sem := make(chan struct{}, stepReadConcurrency)
		var wg sync.WaitGroup
		for i, sp := range j.Spec.Steps {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				st, rev, err := s.Step(ctx, j.ID, sp.ID)
				got[i], errs[i] = VersionedStep{Step: st, Revision: rev}, err
			}()
		}
		wg.Wait()
	}
	out := make([]VersionedStep, 0, n)
	for i := range got {
		if errors.Is(errs[i], ErrNotFound) {
			continue
		}
		if errs[i] != nil {
			return nil, errs[i]
		}
		out = append(out, got[i])
	}
	return out, nil
}

// stepReadConcurrency bounds the step reads of one job in flight at once.
const stepReadConcurrency = 32

// JobIDs lists the ids of every job in the store.
func (s *Store) JobIDs(ctx context.Context) ([]string, error) {
	l, err := s.kv.ListKeysFiltered(ctx, "job.*")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	var ids []string
	for k := range l.Keys() {
		ids = append(ids, strings.TrimPrefix(k, "job."))
	}
	return ids, nil
}

func (s *Store) create(ctx context.Context, key string, v any) (uint64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("encode %s: %w", key, err)
	}
	rev, err := s.kv.Create(ctx, key, b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("create %s: %w", key, ErrExists)
	}
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", key, err)
	}
	return rev, nil
}

func (s *Store) get(ctx context.Context, key string, v any) (uint64, error) {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return 0, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("get %s: %w", key, err)
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return 0, fmt.Errorf("decode %s: %w", key, err)
	}
	return e.Revision(), nil
}

func (s *Store) update(ctx context.Context, key string, v any, rev uint64) (uint64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("encode %s: %w", key, err)
	}
	nrev, err := s.kv.Update(ctx, key, b, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("update %s at revision %d: %w", key, rev, ErrConflict)
	}
	if err != nil {
		return 0, fmt.Errorf("update %s: %w", key, err)
	}
	return nrev, nil
}

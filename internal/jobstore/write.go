package jobstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// Write is one record write: a create (Rev 0) or a compare-and-set update
// of the record at Rev.
type Write struct {
	Key string
	Rev uint64
	Msg *nats.Msg
}

const (
	headerExpectedLastSubjSeq = "Nats-Expected-Last-Subject-Sequence"
	headerTTL                 = "Nats-TTL"
)

// JobWrite encodes j (with its inline steps) as a write of job.<id>.
func (s *Store) JobWrite(j *Job, rev uint64) Write {
	key := protocol.JobKey(j.ID)
	m := s.newMsg(key, rev)
	m.Header.Set(protocol.HeaderRecordState, string(j.State))
	m.Header.Set(protocol.HeaderRecordDesired, string(j.Desired))
	m.Header.Set(protocol.HeaderRecordCreated, j.CreatedAt.UTC().Format(time.RFC3339Nano))
	var lease time.Time
	for _, st := range j.Steps {
		if st.State == StepDispatched && (lease.IsZero() || st.LockedUntil.Before(lease)) {
			lease = st.LockedUntil
		}
	}
	setLease(m, lease)
	if j.TimeoutPending() {
		// The supervisor's recovery asks for the job at its deadline
		// (a scheduler's own wake may be lost with the scheduler).
		m.Header.Set(protocol.HeaderRecordDeadline, j.Deadline.UTC().Format(time.RFC3339Nano))
	}
	if j.State.Terminal() {
		s.setTTL(m)
	}
	m.Data = appendJob(make([]byte, 0, 512+512*len(j.Steps)), j)
	return Write{Key: key, Rev: rev, Msg: m}
}

// StepWrite encodes st as a write of step.<job>.<step>. It carries no TTL,
// finished or not: a step's record must outlive its job, however long the
// job stays open (see EndedStepWrite).
func (s *Store) StepWrite(st *Step, rev uint64) Write {
	key := protocol.StepKey(st.JobID, st.ID)
	m := s.newMsg(key, rev)
	m.Header.Set(protocol.HeaderRecordState, string(st.State))
	m.Header.Set(protocol.HeaderRecordDesired, string(st.Desired))
	if st.State == StepDispatched {
		setLease(m, st.LockedUntil)
	}
	m.Data = appendStep(make([]byte, 0, 768), st)
	return Write{Key: key, Rev: rev, Msg: m}
}

// EndedStepWrite is StepWrite for a step of a job that has ended: the
// record gets the retention TTL, which thus runs from the job's end, as
// the job record's does. Given at each step's own end, as before, it let
// the record of a step that finished early expire while its job still ran
// (a job open longer than the retention), and a scheduler reading the job
// then took the step for one never created and ran it again.
func (s *Store) EndedStepWrite(st *Step, rev uint64) Write {
	w := s.StepWrite(st, rev)
	s.setTTL(w.Msg)
	return w
}

func (s *Store) newMsg(key string, rev uint64) *nats.Msg {
	m := nats.NewMsg("$KV." + protocol.BucketJobs + "." + key)
	m.Header.Set(headerExpectedLastSubjSeq, strconv.FormatUint(rev, 10))
	return m
}

func setLease(m *nats.Msg, lease time.Time) {
	if !lease.IsZero() {
		m.Header.Set(protocol.HeaderRecordLockedUntil, lease.UTC().Format(time.RFC3339Nano))
	}
}

func (s *Store) setTTL(m *nats.Msg) {
	if s.retention > 0 {
		m.Header.Set(headerTTL, s.retention.String())
	}
}

// WithTTL returns w with its own retention instead of the store's: the
// record is removed ttl after the write (never, for 0). A job cancelled
// before its start keeps its records from then on (pkg/client).
func (w Write) WithTTL(ttl time.Duration) Write {
	if ttl <= 0 {
		w.Msg.Header.Del(headerTTL)
	} else {
		w.Msg.Header.Set(headerTTL, ttl.String())
	}
	return w
}

// write publishes w and waits for its PubAck.
func (s *Store) write(ctx context.Context, w Write) (uint64, error) {
	ack, err := s.js.PublishMsg(ctx, w.Msg)
	if err != nil {
		err = writeError(w, err)
		if rev, ok := s.createOverMarker(ctx, w, err); ok {
			return rev, nil
		}
		return 0, err
	}
	return ack.Sequence, nil
}

// createOverMarker writes again a create (w, which failed with err) that
// found its key's last message a removal marker: a record the retention's
// TTL expired (the server keeps the marker an hour) or one deleted by hand
// (kept until purged). A create expects no message at all, so it failed
// with ErrExists, while every read said there was no record: the
// scheduler's "gone now, create it again" went round for as long as the
// marker stayed. The marker is the key's last revision; the create is
// written at it, as nats.go's KeyValue.Create does.
func (s *Store) createOverMarker(ctx context.Context, w Write, err error) (uint64, bool) {
	if w.Rev != 0 || !errors.Is(err, ErrExists) {
		return 0, false
	}
	m, gerr := s.directLast(ctx, w.Key)
	if gerr != nil || m.Header.Get("Status") != "" || !Removed(m.Header) {
		return 0, false
	}
	seq := m.Header.Get("Nats-Sequence")
	again := nats.NewMsg(w.Msg.Subject)
	again.Data = w.Msg.Data
	for k, v := range w.Msg.Header {
		again.Header[k] = v
	}
	again.Header.Set(headerExpectedLastSubjSeq, seq)
	ack, perr := s.js.PublishMsg(ctx, again)
	if perr != nil {
		return 0, false
	}
	return ack.Sequence, true
}

// writeError maps a failed write: a lost compare-and-set is ErrExists for
// a create and ErrConflict for an update.
func writeError(w Write, err error) error {
	if streams.LostCAS(err) {
		if w.Rev == 0 {
			return fmt.Errorf("create %s: %w", w.Key, ErrExists)
		}
		return fmt.Errorf("update %s at revision %d: %w", w.Key, w.Rev, ErrConflict)
	}
	if w.Rev == 0 {
		return fmt.Errorf("create %s: %w", w.Key, err)
	}
	return fmt.Errorf("update %s: %w", w.Key, err)
}

// Batch pipelines writes: Add publishes at once without waiting, Wait
// collects every PubAck. A caller acknowledges the input that caused the
// writes only after Wait says they all landed.
type Batch struct {
	s       *Store
	writes  []Write
	futures []jetstream.PubAckFuture
	errs    []error
}

// Batch starts a batch of pipelined writes.
func (s *Store) Batch() *Batch { return &Batch{s: s} }

// Add publishes w asynchronously and returns its index in the batch.
func (b *Batch) Add(w Write) int {
	f, err := b.s.js.PublishMsgAsync(w.Msg)
	b.writes = append(b.writes, w)
	b.futures = append(b.futures, f)
	b.errs = append(b.errs, err)
	return len(b.writes) - 1
}

// Len is the number of writes added.
func (b *Batch) Len() int { return len(b.writes) }

// Result is the outcome of one write of a batch.
type Result struct {
	Rev uint64
	Err error
}

// Wait waits for every write's PubAck (or ctx) and returns their outcomes
// in the order they were added.
func (b *Batch) Wait(ctx context.Context) []Result {
	out := make([]Result, len(b.writes))
	for i, f := range b.futures {
		if b.errs[i] != nil {
			out[i].Err = writeError(b.writes[i], b.errs[i])
			continue
		}
		select {
		case ack := <-f.Ok():
			out[i].Rev = ack.Sequence
		case err := <-f.Err():
			out[i].Err = writeError(b.writes[i], err)
			if rev, ok := b.s.createOverMarker(ctx, b.writes[i], out[i].Err); ok {
				out[i] = Result{Rev: rev}
			}
		case <-ctx.Done():
			out[i].Err = writeError(b.writes[i], ctx.Err())
		}
	}
	return out
}

package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
)

// follower reads every job-store write as a Record from the record headers
// alone: an ordered, headers-only consumer on the bucket's stream, the last
// write of each key first, then every new write. It never decodes a record
// that carries the headers; a record written without them (before the
// headers existed) is read once and only five fields of it decoded.
//
// The consumer filters on the whole bucket (its stream's one subject), not
// on job.* and step.*.*: the bucket holds only those keys (docs/protocol.md),
// and nats-server (2.11-2.15 at least) looks up the next message of a
// consumer with two or more filters by walking every subject of the current
// file block (msgBlock.firstMatchingMulti) for each message it delivers. On
// a store left with many finished jobs, whose early blocks are sparse (history
// 1), that made a fresh supervisor spend seconds on 20,000 jobs; with one
// filter equal to the stream's subject the server reads the blocks linearly.
// A key of any other form is skipped here, before it is looked at.
type follower struct {
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	log zerolog.Logger
}

// run sends every write to out until ctx ends; loaded is called once the
// writes stored when it started have all been sent.
func (f *follower) run(ctx context.Context, out chan<- Record, loaded func()) error {
	stream := "KV_" + f.kv.Bucket()
	prefix := "$KV." + f.kv.Bucket() + "."
	cons, err := f.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{prefix + ">"},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		HeadersOnly:    true,
	})
	if err != nil {
		return fmt.Errorf("follow job store: %w", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(2000))
	if err != nil {
		return fmt.Errorf("follow job store: %w", err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		loaded()
		loaded = nil
	}
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("follow job store: %w", err)
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		key := strings.TrimPrefix(m.Subject(), prefix)
		if _, _, _, known := parseKey(key); known {
			if r, ok := f.record(ctx, key, m.Headers(), md.Timestamp); ok {
				select {
				case out <- r:
				case <-ctx.Done():
					return nil
				}
			}
		}
		if loaded != nil && md.NumPending == 0 {
			loaded()
			loaded = nil
		}
	}
}

// record builds the Record of one write from its headers.
func (f *follower) record(ctx context.Context, key string, h nats.Header, written time.Time) (Record, bool) {
	r := Record{Key: key, Written: written}
	if jobstore.Removed(h) {
		// A marker read as a record without headers would cost one Get.
		r.Deleted = true
		return r, true
	}
	r.State, r.Desired = h.Get(protocol.HeaderRecordState), h.Get(protocol.HeaderRecordDesired)
	if r.State == "" {
		return f.legacy(ctx, r)
	}
	if v := h.Get(protocol.HeaderRecordLockedUntil); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			f.log.Warn().Err(err).Str("key", key).Msg("unreadable locked-until header; the record is looked at now")
			t = written
		}
		r.LockedUntil = t
	}
	if v := h.Get(protocol.HeaderRecordDeadline); v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			r.Deadline = t
		} else {
			f.log.Warn().Err(err).Str("key", key).Msg("unreadable deadline header; the job's timeout is left to its scheduler")
		}
	}
	return r, true
}

// recordHead is all a record without headers is decoded for.
type recordHead struct {
	ID          string    `json:"id"`
	JobID       string    `json:"job_id"`
	State       string    `json:"state"`
	Desired     string    `json:"desired"`
	LockedUntil time.Time `json:"locked_until"`
}

// legacy reads a record written without the headers and decodes the five
// fields the index needs.
func (f *follower) legacy(ctx context.Context, r Record) (Record, bool) {
	e, err := f.kv.Get(ctx, r.Key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		r.Deleted = true
		return r, true
	}
	if err != nil {
		// State "": unfinished. A job record is looked at after the grace,
		// as a stalled job; a step record's lease is unknown, so it is
		// looked at now (recovery reads it again and, if it holds nothing
		// to release, looks again after the backoff).
		f.log.Warn().Err(err).Str("key", r.Key).Msg("record without headers unreadable; recovery looks at it again")
		if strings.HasPrefix(r.Key, "step.") {
			r.LockedUntil = r.Written
		}
		return r, true
	}
	var head recordHead
	if err := json.Unmarshal(e.Value(), &head); err != nil {
		f.log.Warn().Err(err).Str("key", r.Key).Msg("undecodable record")
		return r, false
	}
	r.State, r.Desired, r.LockedUntil = head.State, head.Desired, head.LockedUntil
	if !strings.HasPrefix(r.Key, "step.") {
		r.LockedUntil = time.Time{} // a job record's own locked_until is not a step's lease
	}
	return r, true
}

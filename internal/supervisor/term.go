package supervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// errNotLeader stops a side effect the leader may no longer cause.
var errNotLeader = errors.New("not the supervisor leader any more")

// leaseHolder is what a term needs of the election: lease.Elector.
type leaseHolder interface {
	// Leader reports the fencing epoch while the lease is held.
	Leader() (uint64, bool)
}

// term is one term of leadership and the only way the leader's components
// cause side effects: every job-store write, event, publish, message
// delete and health record goes through it, and each checks the lease
// first. A deposed leader (its lease lost, or renewed by a newer epoch)
// writes, publishes and deletes nothing: it cannot get around the check
// because it holds no other handle that writes.
type term struct {
	epoch  uint64
	lease  leaseHolder
	js     jetstream.JetStream
	store  *jobstore.Store
	events *events.Publisher
	now    func() time.Time
}

// note publishes the event of a change already written: a failure is
// logged, not returned, since the change itself stands.
func (t *term) note(ctx context.Context, log zerolog.Logger, e protocol.Event) {
	if err := t.event(ctx, e); err != nil {
		log.Warn().Err(err).Str("kind", string(e.Kind)).Str(logging.FieldJob, e.JobID).Msg("event not published")
	}
}

// fence returns errNotLeader unless this term still holds the lease.
func (t *term) fence() error {
	epoch, ok := t.lease.Leader()
	if !ok || epoch != t.epoch {
		return errNotLeader
	}
	return nil
}

// updateStep writes st if the record is still at rev (jobstore CAS).
func (t *term) updateStep(ctx context.Context, st *jobstore.Step, rev uint64) (uint64, error) {
	if err := t.fence(); err != nil {
		return 0, err
	}
	return t.store.UpdateStep(ctx, st, rev)
}

// event publishes e; its Nats-Msg-Id is derived from what it describes
// (package events), so the same event published twice is stored once.
func (t *term) event(ctx context.Context, e protocol.Event) error {
	if err := t.fence(); err != nil {
		return err
	}
	return t.events.Publish(ctx, e)
}

// eventOnce publishes e with a Nats-Msg-Id derived from its kind, id and
// occurrence, for events whose body carries measurements (a duration) that
// differ between two descriptions of the same thing.
func (t *term) eventOnce(ctx context.Context, e protocol.Event, occurrence string) error {
	if err := t.fence(); err != nil {
		return err
	}
	return t.events.PublishOnce(ctx, e, occurrence)
}

// publish sends msg with a JetStream publish and returns its PubAck
// (whose Duplicate says the stream dropped msg for its Nats-Msg-Id).
func (t *term) publish(ctx context.Context, msg *nats.Msg) (*jetstream.PubAck, error) {
	if err := t.fence(); err != nil {
		return nil, err
	}
	ack, err := t.js.PublishMsg(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("publish %s: %w", msg.Subject, err)
	}
	return ack, nil
}

// deleteMsg removes message seq from stream; one already gone is fine.
func (t *term) deleteMsg(ctx context.Context, stream jetstream.Stream, seq uint64) error {
	if err := t.fence(); err != nil {
		return err
	}
	return streams.DeleteMsg(ctx, stream, seq)
}

// kvPut writes a key of a bucket the leader owns (warden_health).
func (t *term) kvPut(ctx context.Context, kv jetstream.KeyValue, key string, value []byte) error {
	if err := t.fence(); err != nil {
		return err
	}
	_, err := kv.Put(ctx, key, value)
	return err
}

// kvDelete removes a key of a bucket the leader owns (warden_health).
func (t *term) kvDelete(ctx context.Context, kv jetstream.KeyValue, key string) error {
	if err := t.fence(); err != nil {
		return err
	}
	return kv.Delete(ctx, key)
}

// control runs an order to an agent (drain, undrain, limit) if this term
// still holds the lease.
func (t *term) control(f func() error) error {
	if err := t.fence(); err != nil {
		return err
	}
	return f()
}

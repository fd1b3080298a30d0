package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// lease is a member's hold on cluster.<name> in warden_leases. Unlike
// internal/lease (one TTL for the whole bucket), every write carries its
// own per-message TTL, the cluster's leader_election.lease_duration:
//
//   - acquire: Create with that TTL; it fails while anyone holds the key.
//     The revision of the Create is the leader's epoch.
//   - renew: a publish to the key's subject expecting the last revision
//     (compare-and-set) with the TTL again; a failure means deposed.
//   - the holder counts itself leader only until the last successful
//     write plus the TTL, measured from before the write was sent, so a
//     process paused past its lease knows it is deposed the moment it runs.
type lease struct {
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	key string
	who string // presence key of this member
	now func() time.Time

	// bucketTTL is warden_leases' own TTL (the supervisor's lease_ttl):
	// the server removes every key that old whatever its per-message TTL,
	// so a longer lease_duration would vanish while held and a standby
	// would take it beside a leader that still believes it leads. Zero:
	// no bucket limit. The lease's TTL is never above it.
	bucketTTL time.Duration

	mu      sync.Mutex
	ttl     time.Duration
	heldTTL time.Duration // the TTL the current hold was written with
	epoch   uint64
	rev     uint64
	validTo time.Time
}

func (l *lease) value() []byte {
	b, _ := json.Marshal(map[string]any{"id": l.who, "renewed": l.now().UTC()})
	return b
}

// held returns the epoch while the lease is held and provably valid.
func (l *lease) held() (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.epoch == 0 || !l.now().Before(l.validTo) {
		return 0, false
	}
	return l.epoch, true
}

// renewEvery is how long the holder may wait before its next renewal: a
// third of the shorter of the TTL its last write carried and the TTL
// configured now, so that a lease_duration shortened or lengthened
// meanwhile never outlasts the hold.
func (l *lease) renewEvery() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.ttl
	if l.heldTTL > 0 {
		d = min(d, l.heldTTL)
	}
	return d / 3
}

// setTTL sets the lease's TTL, at most the bucket's, and returns the TTL
// it set.
func (l *lease) setTTL(d time.Duration) time.Duration {
	if l.bucketTTL > 0 && d > l.bucketTTL {
		d = l.bucketTTL
	}
	l.mu.Lock()
	l.ttl = d
	l.mu.Unlock()
	return d
}

// acquire tries to create the key. It returns false, nil when another
// member holds it.
func (l *lease) acquire(ctx context.Context) (bool, error) {
	l.mu.Lock()
	ttl := l.ttl
	l.mu.Unlock()
	start := l.now()
	rev, err := l.kv.Create(ctx, l.key, l.value(), jetstream.KeyTTL(ttl))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("acquire %s: %w", l.key, err)
	}
	l.mu.Lock()
	l.epoch, l.rev, l.validTo, l.heldTTL = rev, rev, start.Add(ttl), ttl
	l.mu.Unlock()
	return true, nil
}

// renew extends the lease; an error means it is lost.
func (l *lease) renew(ctx context.Context) error {
	l.mu.Lock()
	ttl, rev, epoch := l.ttl, l.rev, l.epoch
	l.mu.Unlock()
	if epoch == 0 {
		return errors.New("lease not held")
	}
	start := l.now()
	ack, err := l.js.Publish(ctx, "$KV."+protocol.BucketLeases+"."+l.key, l.value(),
		jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(ttl))
	if err != nil {
		l.drop()
		return fmt.Errorf("renew %s: %w", l.key, err)
	}
	l.mu.Lock()
	if l.epoch == epoch {
		l.rev, l.validTo, l.heldTTL = ack.Sequence, start.Add(ttl), ttl
	}
	l.mu.Unlock()
	return nil
}

// drop forgets the lease without touching the key.
func (l *lease) drop() {
	l.mu.Lock()
	l.epoch, l.rev, l.validTo, l.heldTTL = 0, 0, time.Time{}, 0
	l.mu.Unlock()
}

// release deletes the key if it is still ours, so a standby need not wait
// for the TTL.
func (l *lease) release(ctx context.Context) {
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	l.drop()
	if rev != 0 {
		_ = l.kv.Delete(ctx, l.key, jetstream.LastRevision(rev))
	}
}

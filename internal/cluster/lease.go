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
//     write plus the key's life as the server keeps it (keyTTL: whole
//     seconds, at most the bucket's max age), measured from before the
//     write was sent, so a process paused past its lease knows it is
//     deposed the moment it runs.
type lease struct {
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	key string
	who string // presence key of this member
	now func() time.Time

	mu sync.Mutex
	// bucketTTL is warden_leases' own TTL, its max age (the supervisor's
	// lease_ttl): the server removes every key that old whatever its
	// per-message TTL, so a longer lease would vanish while held and a
	// standby would take it beside a leader that still believes it leads.
	// Zero: no bucket limit. Read again after every write (recap), since
	// an operator may lower it while members run.
	bucketTTL time.Duration
	want      time.Duration // lease_duration as configured
	heldTTL   time.Duration // how long the key written last lives
	heldAt    time.Time     // when that write was sent
	epoch     uint64
	rev       uint64
	validTo   time.Time
}

// keyTTL returns the TTL a write of a lease of want carries under a bucket
// whose max age is bucket (0: none), and how long the key then lives. The
// server counts a message's TTL in whole seconds and drops the fraction
// (nats-server parseMessageTTL: "1.5s" lives 1 s), refuses one under a
// second, and removes a message older than the bucket's max age whatever
// its TTL. The holder must count on exactly the life returned, never on
// want.
func keyTTL(want, bucket time.Duration) (send, lives time.Duration) {
	d := want
	if bucket > 0 {
		d = min(d, bucket)
	}
	send = max(d.Truncate(time.Second), minLease)
	lives = send
	if bucket > 0 {
		lives = min(lives, bucket)
	}
	return send, lives
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
// third of the shorter of the life of the key written last and the life a
// write would have now, so that a lease_duration (or a bucket max age)
// shortened or lengthened meanwhile never outlasts the hold.
func (l *lease) renewEvery() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, d := keyTTL(l.want, l.bucketTTL)
	if l.heldTTL > 0 {
		d = min(d, l.heldTTL)
	}
	return d / 3
}

// setTTL sets the lease_duration and returns how long a key written with
// it lives (keyTTL): less when it is not whole seconds or is above the
// bucket's max age.
func (l *lease) setTTL(d time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.want = d
	_, lives := keyTTL(d, l.bucketTTL)
	return lives
}

// heldLocked records a successful write sent at start whose key lives
// lives, cut to the bucket's max age as known now (it may have been read
// again while the write was under way).
func (l *lease) heldLocked(rev uint64, start time.Time, lives time.Duration) {
	if l.bucketTTL > 0 {
		lives = min(lives, l.bucketTTL)
	}
	l.rev, l.heldAt, l.heldTTL, l.validTo = rev, start, lives, start.Add(lives)
}

// acquire tries to create the key. It returns false, nil when another
// member holds it.
func (l *lease) acquire(ctx context.Context) (bool, error) {
	l.mu.Lock()
	send, lives := keyTTL(l.want, l.bucketTTL)
	l.mu.Unlock()
	start := l.now()
	rev, err := l.kv.Create(ctx, l.key, l.value(), jetstream.KeyTTL(send))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("acquire %s: %w", l.key, err)
	}
	l.mu.Lock()
	l.epoch = rev
	l.heldLocked(rev, start, lives)
	l.mu.Unlock()
	// The bucket's max age is read again after the first renewal, a third
	// of the lease from now (renewLoop), not here: read here, inside the
	// win, it delayed the new leader's first state write, and sync tests
	// (TestStateSyncConverges, TestSyncSurvivesLeadingAgain) timed out one
	// run in three. Until then a max age lowered meanwhile is the one
	// read at start or at the last renewal.
	return true, nil
}

// renew extends the lease; an error means it is lost.
func (l *lease) renew(ctx context.Context) error {
	l.mu.Lock()
	send, lives := keyTTL(l.want, l.bucketTTL)
	rev, epoch := l.rev, l.epoch
	l.mu.Unlock()
	if epoch == 0 {
		return errors.New("lease not held")
	}
	start := l.now()
	ack, err := l.js.Publish(ctx, "$KV."+protocol.BucketClusterLeases+"."+l.key, l.value(),
		jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(send))
	if err != nil {
		l.drop()
		return fmt.Errorf("renew %s: %w", l.key, err)
	}
	l.mu.Lock()
	if l.epoch == epoch {
		l.heldLocked(ack.Sequence, start, lives)
	}
	l.mu.Unlock()
	return nil
}

// recap reads the bucket's max age again. The key written last lives at
// most that long from its write (the server applies a lowered max age to
// the messages it has), so the hold is cut to it at once, and the next
// write's TTL follows it. It returns the life a write has before and after.
func (l *lease) recap(ctx context.Context) (before, after time.Duration, err error) {
	st, err := l.kv.Status(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("read %s: %w", protocol.BucketClusterLeases, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, before = keyTTL(l.want, l.bucketTTL)
	l.bucketTTL = st.TTL()
	_, after = keyTTL(l.want, l.bucketTTL)
	if c := l.bucketTTL; c > 0 && l.epoch != 0 && l.heldTTL > c {
		l.heldTTL = c
		if end := l.heldAt.Add(c); end.Before(l.validTo) {
			l.validTo = end
		}
	}
	return before, after, nil
}

// drop forgets the lease without touching the key.
func (l *lease) drop() {
	l.mu.Lock()
	l.epoch, l.rev, l.validTo, l.heldTTL, l.heldAt = 0, 0, time.Time{}, 0, time.Time{}
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

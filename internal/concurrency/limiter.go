package concurrency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// Config tunes a Limiter.
type Config struct {
	// WaitLease is how long a waiter keeps its place without asking again.
	// Defaults to 30s. The caller must call Acquire again before then.
	WaitLease time.Duration
	// RetryAfter is the retry time returned to a queued waiter when no
	// lease ends sooner. Defaults to 5s; Release's answer usually wakes the
	// waiter first.
	RetryAfter time.Duration
	// MaxWaiters bounds a key's queue. Defaults to 2000. A key's holders
	// and waiters live in one KV value, which must fit a message (1 MiB;
	// an entry is up to ~320 bytes): past the bound a step is not queued
	// but told to ask again after RetryAfter, and takes a slot only when
	// the queue has shrunk below it. Without it, enough steps waiting on
	// one key made the value unwritable and every step using the key
	// waited forever.
	MaxWaiters int
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	if c.WaitLease <= 0 {
		c.WaitLease = 30 * time.Second
	}
	if c.RetryAfter <= 0 {
		c.RetryAfter = 5 * time.Second
	}
	if c.MaxWaiters <= 0 {
		c.MaxWaiters = 2000
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Limiter grants and releases slots of concurrency keys.
type Limiter struct {
	kv jetstream.KeyValue
	// stream is the bucket's stream, read directly to learn a removed
	// key's marker revision (kv.Get hides it).
	stream jetstream.Stream
	cfg    Config
	// markerTTL is how long the marker of a removed record stays: the
	// bucket's limit_marker_ttl. 0 (a bucket made before records were
	// removed, not yet updated by `warden setup`): empty records are
	// written and kept, as then.
	markerTTL time.Duration
	// keys serialises this process's updates of each key: its callers
	// would otherwise lose compare-and-set races to each other and retry,
	// each retry another read and write of a record that grows with the
	// queue. Races with other processes are still settled by the CAS.
	// A key's state is dropped when no caller is using it and it caches
	// nothing (one per key ever used would grow without bound).
	mu   sync.Mutex
	keys map[string]*keyState
	// sweepAt is the size of keys at which the next new key first
	// sweeps it (sweep).
	sweepAt int
	// full holds the keys found with a full queue (stillFull); guarded
	// by mu.
	full map[string]fullKey
}

// keyState is this process's hold on one key: the mutex that serialises
// its updates, and the record as this process last wrote or read it.
// Serialised, a write is usually the next one: it is tried on the cached
// revision without reading first, one round trip instead of two for each
// Acquire and Release on a handoff. A stale revision costs a rejected
// write and a read, as before; after one, the cache is not trusted for a
// while (other processes write the key too).
type keyState struct {
	users      int // callers using it; guarded by Limiter.mu
	mu         sync.Mutex
	rev        uint64 // 0: nothing cached
	rec        record
	doubtUntil time.Time
}

// remember caches r at revision rev, or nothing for an idle key: its next
// use reads first.
func (ks *keyState) remember(rev uint64, r record, idle bool) {
	if idle {
		rev, r = 0, record{}
	}
	ks.rev, ks.rec = rev, r
}

// doubtFor is how long the cache is bypassed after it proved stale.
const doubtFor = time.Second

// New opens the warden_concurrency bucket (streams.EnsureWorkflow creates it).
func New(ctx context.Context, js jetstream.JetStream, cfg Config) (*Limiter, error) {
	kv, err := js.KeyValue(ctx, streams.BucketConcurrency)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", streams.BucketConcurrency, err)
	}
	s, err := js.Stream(ctx, "KV_"+streams.BucketConcurrency)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", streams.BucketConcurrency, err)
	}
	return &Limiter{
		kv: kv, stream: s, cfg: cfg.WithDefaults(),
		markerTTL: s.CachedInfo().Config.SubjectDeleteMarkerTTL, // the bucket's limit_marker_ttl
		keys:      map[string]*keyState{},
	}, nil
}

// hold returns key's state, locked, counted as used until letGo.
func (l *Limiter) hold(key string) *keyState {
	l.mu.Lock()
	ks := l.keys[key]
	if ks == nil {
		if len(l.keys) >= max(l.sweepAt, minSweep) {
			l.sweep()
		}
		ks = new(keyState)
		l.keys[key] = ks
	}
	ks.users++
	l.mu.Unlock()
	ks.mu.Lock()
	return ks
}

// minSweep is the fewest keys at which hold sweeps.
const minSweep = 1024

// sweep drops the states no caller uses whose cached record holds no
// live lease, and the full queues no longer full. A key's state was
// dropped only when this process wrote the record idle: one acquired here
// and released by another scheduler (routine: any may dispatch, results
// go to the partition's owner) stayed for good, and per-entity keys grew
// the map without bound. The next sweep waits for twice as many keys.
// Lock held.
func (l *Limiter) sweep() {
	now := l.cfg.Now()
	for key, ks := range l.keys {
		if ks.users == 0 && !ks.rec.liveAt(now) {
			delete(l.keys, key)
		}
	}
	for key, f := range l.full {
		if !time.Now().Before(f.until) {
			delete(l.full, key)
		}
	}
	l.sweepAt = 2 * len(l.keys)
}

// letGo unlocks ks and drops it when no one else uses it and it caches
// nothing (a later use reads the key first, as it would anyway).
func (l *Limiter) letGo(key string, ks *keyState) {
	ks.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if ks.users--; ks.users == 0 && ks.rev == 0 {
		delete(l.keys, key)
	}
}

// entry is a holder or a waiter.
type entry struct {
	ID    string    `json:"id"`
	Until time.Time `json:"until"`
	// Since is when a waiter first asked.
	Since time.Time `json:"since,omitzero"`
	// Priority is a waiter's priority; empty for normal (and in records
	// of versions that did not know priorities, which read as normal).
	Priority spec.Priority `json:"priority,omitempty"`
}

// stored is priority p as a waiter's entry keeps it: normal (and an
// unknown priority, which ranks as normal) as empty, so that a queue of
// normal steps is written as before priorities were.
func stored(p spec.Priority) spec.Priority {
	if p.RankOrNormal() == spec.PriorityNormal.Rank() {
		return ""
	}
	return p
}

// served compares waiters a and b in the order they are served: higher
// priority first. Waiters of one priority are served in arrival order,
// which is their order in the record (order keeps it): the order their
// compare-and-set writes landed in, which their Since (each scheduler's
// clock) only approximates.
func served(a, b entry) int {
	return b.Priority.RankOrNormal() - a.Priority.RankOrNormal()
}

// record is a key's state. Its waiters are written in the order they are
// served, so that a version that did not know priorities, which serves
// them in the order written, serves them by priority too.
type record struct {
	Limit   int     `json:"limit"`
	Holders []entry `json:"holders,omitempty"`
	Waiters []entry `json:"waiters,omitempty"`
}

// liveAt reports whether a holder's or a waiter's lease is still running
// at now.
func (r *record) liveAt(now time.Time) bool {
	live := func(e entry) bool { return !now.After(e.Until) }
	return slices.ContainsFunc(r.Holders, live) || slices.ContainsFunc(r.Waiters, live)
}

// nextUp are the waiters the free slots belong to, in the order they are
// served.
func (r *record) nextUp() []string {
	var next []string
	for i := 0; i < len(r.Waiters) && i < r.Limit-len(r.Holders); i++ {
		next = append(next, r.Waiters[i].ID)
	}
	return next
}

// prune drops expired holders and waiters.
func (r *record) prune(now time.Time) {
	live := func(e entry) bool { return now.After(e.Until) }
	r.Holders = slices.DeleteFunc(r.Holders, live)
	r.Waiters = slices.DeleteFunc(r.Waiters, live)
}

// order sorts the waiters in the order they are served (served), keeping
// the order of waiters of one priority. A record is written so, and an
// older version's writes keep it so (they drop every priority: all are
// normal, in the order written, a newcomer last); order matters when a
// waiter asks at another priority.
func (r *record) order() {
	slices.SortStableFunc(r.Waiters, served)
}

// ErrConflict is returned when a key stayed contended for every CAS
// attempt; it is transient: ask again later.
var ErrConflict = errors.New("concurrency key contended, try again")

const maxCAS = 16

// update applies fn to key's record with compare-and-set, retrying lost
// races. fn returns whether to write. A decision to write nothing is made
// on the stored record, never on the cached one (which no CAS checks).
// A record left empty is removed instead, by a purge at its revision: an
// Acquire that wrote meanwhile makes it fail, as it would an update.
func (l *Limiter) update(ctx context.Context, key string, fn func(r *record) bool) error {
	if !protocol.ValidKVKey(key) {
		// Checked here, not only by the writes: read takes the key as a
		// subject, where a wildcard would read another key's record.
		return fmt.Errorf("concurrency key %q: %w", key, jetstream.ErrInvalidKey)
	}
	ks := l.hold(key)
	defer l.letGo(key, ks)
	for attempt := range maxCAS {
		if attempt > 0 {
			// Lost a race: back off a little, with jitter, so that
			// contenders spread out instead of colliding again.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(rand.Int64N(int64(attempt) * int64(time.Millisecond)))):
			}
		}
		cached := ks.rev != 0 && time.Now().After(ks.doubtUntil)
		var (
			r    record
			rev  uint64
			gone bool
			err  error
		)
		if cached {
			r, rev = ks.rec.clone(), ks.rev
		} else if r, rev, gone, err = l.read(ctx, key); err != nil {
			return err
		}
		write := fn(&r)
		if !write && cached {
			if r, rev, gone, err = l.read(ctx, key); err != nil {
				return err
			}
			write = fn(&r)
		}
		idle := len(r.Holders)+len(r.Waiters) == 0
		// An empty record is removed, not written (nor kept when it
		// was found so: written by an older version, or left by
		// leases that ended).
		remove := idle && l.markerTTL > 0
		if remove && (rev == 0 || gone) || !write && !remove {
			ks.remember(rev, r, idle)
			return nil
		}
		var at uint64
		if at, err = l.store(ctx, key, r, rev, remove); err == nil {
			ks.remember(at, r, idle)
			return nil
		}
		ks.rev = 0
		if cached {
			ks.doubtUntil = time.Now().Add(doubtFor)
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !streams.LostCAS(err) {
			return fmt.Errorf("write concurrency key %s: %w", key, err)
		}
	}
	return ErrConflict
}

// store writes r on revision rev (a record's or a removed record's
// marker; 0: the key holds nothing), or removes the record when remove is
// set, by a purge at rev: a compare-and-set as Update is (an Acquire that
// wrote meanwhile makes it fail, and the caller decides again). rev is
// never 0 then: LastRevision(0) would purge whatever is stored. The purge
// leaves a marker that expires after markerTTL.
func (l *Limiter) store(ctx context.Context, key string, r record, rev uint64, remove bool) (uint64, error) {
	if remove {
		return 0, l.kv.Purge(ctx, key, jetstream.LastRevision(rev), jetstream.PurgeTTL(l.markerTTL))
	}
	b, err := json.Marshal(r)
	if err != nil {
		return 0, err
	}
	if rev == 0 {
		return l.kv.Create(ctx, key, b)
	}
	return l.kv.Update(ctx, key, b, rev)
}

// read returns key's stored record and its revision; for a removed key,
// an empty record, gone, and the revision of the removal's marker, so
// that the key is written again on it in one round trip (Create would
// find the marker and need two more); 0 when the key holds nothing.
func (l *Limiter) read(ctx context.Context, key string) (r record, rev uint64, gone bool, err error) {
	m, err := l.stream.GetLastMsgForSubject(ctx, "$KV."+streams.BucketConcurrency+"."+key)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return r, 0, false, nil
	case err != nil:
		return r, 0, false, fmt.Errorf("read concurrency key %s: %w", key, err)
	}
	if jobstore.Removed(m.Header) {
		return r, m.Sequence, true, nil
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return r, 0, false, fmt.Errorf("decode concurrency key %s: %w", key, err)
	}
	return r, m.Sequence, false, nil
}

// clone copies r, so that a decision on the cached record leaves it as it
// was when the write is refused.
func (r record) clone() record {
	r.Holders, r.Waiters = slices.Clone(r.Holders), slices.Clone(r.Waiters)
	return r
}

// Acquire asks for a slot of key (at most limit holders) for holder, for
// lease, at normal priority: AcquireGrant, answering only whether it was
// granted.
func (l *Limiter) Acquire(ctx context.Context, key string, limit int, holder string, lease time.Duration) (granted bool, retryAt time.Time, err error) {
	g, retryAt, err := l.AcquireGrant(ctx, key, limit, holder, lease, spec.PriorityNormal)
	return g.Granted, retryAt, err
}

// Grant is what AcquireGrant gave: a slot until Until, new or, Renewed, one
// the holder already had, whose lease ended at Prev before.
type Grant struct {
	Granted, Renewed bool
	Until, Prev      time.Time
}

// AcquireGrant asks for a slot of key (at most limit holders) for holder,
// waiting at priority p, for lease. It is granted when holder already
// holds a slot (its lease is renewed) or a slot is free for it: fewer
// waiters are served before it (higher priority, or the same and earlier)
// than slots are free. Otherwise holder is queued (or keeps its place;
// asked with another priority, it moves to that priority's place) and
// retryAt says when to ask again at the latest (soon for the next in
// line, about half the wait lease for those further back, who are woken
// through Release). limit is the key's limit as the spec states it; the
// latest caller's limit wins.
//
// It says what was granted, so that a caller that gives the slot back
// unused can release only what it took (ReleaseGrant). Several schedulers
// may ask for the same holder (a step's id): the second is granted the
// first's slot as a renewal.
func (l *Limiter) AcquireGrant(ctx context.Context, key string, limit int, holder string, lease time.Duration, p spec.Priority) (g Grant, retryAt time.Time, err error) {
	if limit < 1 {
		return Grant{}, time.Time{}, fmt.Errorf("concurrency key %s: limit %d", key, limit)
	}
	if l.stillFull(key, holder) {
		return Grant{}, l.overflowRetry(), nil
	}
	p = stored(p)
	var full map[string]bool // the waiters of a key found full
	err = l.update(ctx, key, func(r *record) bool {
		now := l.cfg.Now()
		r.prune(now)
		r.Limit = limit
		retryAt, g, full = time.Time{}, Grant{}, nil
		if i := slices.IndexFunc(r.Holders, func(e entry) bool { return e.ID == holder }); i >= 0 {
			prev := r.Holders[i].Until
			r.Holders[i].Until = now.Add(lease)
			g = Grant{Granted: true, Renewed: true, Until: r.Holders[i].Until, Prev: prev}
			return true
		}
		free := limit - len(r.Holders)
		isHolder := func(e entry) bool { return e.ID == holder }
		pos := slices.IndexFunc(r.Waiters, isHolder)
		queued := pos >= 0
		moved := queued && r.Waiters[pos].Priority != p
		// ahead: how many are served before it; its index in the queue,
		// which a record keeps in serving order (record).
		ahead := pos
		if moved {
			// Asked at another priority (or an older version wrote the
			// queue without priorities): it takes that priority's place.
			r.Waiters[pos].Priority = p
			r.order()
			ahead = slices.IndexFunc(r.Waiters, isHolder)
		}
		me := entry{ID: holder, Since: now, Until: now.Add(l.cfg.WaitLease), Priority: p}
		if !queued {
			// A newcomer's place: behind every waiter of its priority or
			// higher.
			if ahead = slices.IndexFunc(r.Waiters, func(e entry) bool { return served(e, me) > 0 }); ahead < 0 {
				ahead = len(r.Waiters)
			}
		}
		if ahead < free {
			if queued {
				r.Waiters = slices.Delete(r.Waiters, ahead, ahead+1)
			}
			r.Holders = append(r.Holders, entry{ID: holder, Until: now.Add(lease)})
			g = Grant{Granted: true, Until: now.Add(lease)}
			return true
		}
		// A waiter among the next `limit` in line asks again when a
		// holder's lease ends (a crashed holder frees its slot then) or
		// after RetryAfter; one further back only renews its place: a
		// Release names the waiters the freed slots belong to, and the
		// caller wakes them.
		retryAt = now.Add(l.cfg.WaitLease / 2)
		if ahead < limit {
			retryAt = now.Add(l.cfg.RetryAfter)
			for _, h := range r.Holders {
				if h.Until.Before(retryAt) {
					retryAt = h.Until
				}
			}
		}
		if queued {
			// Still queued: renew the wait lease only when half of it is
			// gone, so that waiters asking again mostly just read.
			if !moved && r.Waiters[ahead].Until.Sub(now) > l.cfg.WaitLease/2 {
				return false
			}
			r.Waiters[ahead].Until = now.Add(l.cfg.WaitLease)
		} else if len(r.Waiters) >= l.cfg.MaxWaiters {
			// The queue is full: not queued, ask again.
			retryAt = l.overflowRetry()
			full = make(map[string]bool, len(r.Waiters)+len(r.Holders))
			for _, e := range slices.Concat(r.Waiters, r.Holders) {
				full[e.ID] = true // a holder asking again renews its slot
			}
			return false
		} else {
			r.Waiters = slices.Insert(r.Waiters, ahead, me)
		}
		return true
	})
	if err == nil && full != nil {
		l.noteFull(key, full)
	}
	return g, retryAt, err
}

// fullFor is how long a key found with a full queue is answered from
// memory for steps not in its queue.
const fullFor = time.Second

// fullKey is a key this process found with a full queue: until when, and
// who was queued or held a slot then (they always ask the record: a
// holder re-dispatched after its agent died renews its slot, and was
// refused from memory while its slot idled).
type fullKey struct {
	until time.Time
	known map[string]bool
}

// noteFull remembers that key's queue is full, with its waiters and holders.
func (l *Limiter) noteFull(key string, known map[string]bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.full == nil {
		l.full = map[string]fullKey{}
	}
	l.full[key] = fullKey{until: time.Now().Add(fullFor), known: known}
}

// stillFull reports whether key's queue was found full less than fullFor
// ago and holder was neither in it nor holding a slot: the answer would be
// the same, so the key is not read. Every step past the bound asked again every RetryAfter,
// each a read of a record up to ~600 KB: 10,000 of them were 2,000 reads
// a second of one key. A queued step (a waiter renewing its place, or
// woken by a Release) always asks the record.
func (l *Limiter) stillFull(key, holder string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, ok := l.full[key]
	if !ok {
		return false
	}
	if !time.Now().Before(f.until) {
		delete(l.full, key)
		return false
	}
	return !f.known[holder]
}

// forgetFull drops what this process knew of key's full queue: a
// Release here made room.
func (l *Limiter) forgetFull(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.full, key)
}

// overflowRetry is when a step past a full queue asks again: RetryAfter
// on average, spread over half to one and a half of it, so that the steps
// refused together do not come back together.
func (l *Limiter) overflowRetry() time.Time {
	d := l.cfg.RetryAfter
	return l.cfg.Now().Add(d/2 + rand.N(d))
}

// Release gives up holder's slot of key (a no-op if it holds none, e.g.
// its lease ended) and removes it from the queue. It returns the waiters
// the freed slots now belong to, in the order they are served (as
// AcquireGrant grants), so the caller can wake them.
func (l *Limiter) Release(ctx context.Context, key, holder string) (next []string, err error) {
	return l.release(ctx, key, holder, time.Time{})
}

// GiveBack gives back what AcquireGrant granted g and its caller did not
// use, unless someone renewed the holder's slot since (its lease no longer
// ends at g.Until: another caller's grant of the same holder, whose step
// may be running on it). A new slot is released. A renewal gets its lease
// back (g.Prev), or frees the slot if that has passed: a step taken back
// from a dead agent keeps its slot until its lease ends (its task may
// still run, cut off), and asking again while it waited for an agent
// renewed that lease every time, so the key stayed held, for as long as
// the step waited, by a step that ran nowhere. It returns the waiters the
// freed slots now belong to.
func (l *Limiter) GiveBack(ctx context.Context, key, holder string, g Grant) (next []string, err error) {
	if !g.Renewed {
		return l.release(ctx, key, holder, g.Until)
	}
	defer l.forgetFull(key)
	err = l.update(ctx, key, func(r *record) bool {
		next = nil
		i := slices.IndexFunc(r.Holders, func(e entry) bool { return e.ID == holder })
		if i < 0 || !r.Holders[i].Until.Equal(g.Until) {
			return false
		}
		now := l.cfg.Now()
		if g.Prev.After(now) {
			r.Holders[i].Until = g.Prev
			return true
		}
		r.Holders = slices.Delete(r.Holders, i, i+1)
		r.prune(now)
		next = r.nextUp()
		return true
	})
	return next, err
}

// release is Release, kept from a holder whose lease ends after until
// when until is set.
func (l *Limiter) release(ctx context.Context, key, holder string, until time.Time) (next []string, err error) {
	defer l.forgetFull(key)
	err = l.update(ctx, key, func(r *record) bool {
		next = nil
		now := l.cfg.Now()
		before := len(r.Holders) + len(r.Waiters)
		r.prune(now)
		if i := slices.IndexFunc(r.Holders, func(e entry) bool { return e.ID == holder }); i >= 0 && !until.IsZero() && r.Holders[i].Until.After(until) {
			return len(r.Holders)+len(r.Waiters) != before // renewed since: not ours to give back
		}
		r.Holders = slices.DeleteFunc(r.Holders, func(e entry) bool { return e.ID == holder })
		r.Waiters = slices.DeleteFunc(r.Waiters, func(e entry) bool { return e.ID == holder })
		next = r.nextUp()
		return len(r.Holders)+len(r.Waiters) != before
	})
	return next, err
}

// State is a key's current holders and waiters, for inspection.
type State struct {
	Limit   int
	Holders []string
	Waiters []string
}

// Inspect returns key's live holders and its live waiters in the order
// they are served.
func (l *Limiter) Inspect(ctx context.Context, key string) (State, error) {
	var st State
	e, err := l.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	var r record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return st, err
	}
	r.prune(l.cfg.Now())
	st.Limit = r.Limit
	for _, h := range r.Holders {
		st.Holders = append(st.Holders, h.ID)
	}
	for _, w := range r.Waiters {
		st.Waiters = append(st.Waiters, w.ID)
	}
	return st, nil
}

package presence

// This file is the agent side of presence: one Announcer per agent process
// owns the key <pool>.<agent> in the warden_presence bucket.
//
// Guarantees:
//   - At most one live process holds a key: the key is won with Create and
//     kept with a compare-and-set Update on the revision we last wrote, so a
//     second process with the same id either fails to start (*DuplicateError)
//     or, if it somehow took the key, makes the first one stop.
//   - A key left by a crashed run of the same agent does not block a restart
//     for longer than the bucket TTL plus a second.
//   - A process that was paused past the TTL re-announces itself when it
//     resumes, unless someone else took the key meanwhile.
//   - It reads and writes its own key only, with direct gets and publishes:
//     it creates no consumer on the bucket (see observe), so an agent's
//     credential needs none.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/protocol"
)

// AnnouncerConfig configures an Announcer.
type AnnouncerConfig struct {
	// Pool and ID name the agent; the key is protocol.PresenceKey(Pool, ID).
	Pool string
	ID   string
	// Interval between heartbeats. Defaults to 1s. Must be less than half
	// the TTL so that one lost heartbeat does not expire the key.
	Interval time.Duration
	// TTL of a key. Defaults to the bucket's TTL, read from the server.
	TTL time.Duration
	// Presence returns the value of the next heartbeat. HeartbeatAt is set
	// by the Announcer, and so are HeartbeatInterval (to Interval) and
	// Utilisation (sampled, see Usage and UtilisationStep) when the value
	// leaves them unset. Readers decode a record again only when it
	// changed in more than heartbeat_at, so keep what it returns stable
	// between heartbeats when nothing material changed.
	// Required.
	Presence func() protocol.Presence
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Logger receives warnings about transient heartbeat failures.
	Logger zerolog.Logger
}

// DuplicateError says that another live process holds this agent's presence
// key: either it was there first (Start fails) or it took the key over while
// we were running (the heartbeat loop stops).
type DuplicateError struct {
	Key string
	// Other is the other process's presence value as found in the bucket.
	Other protocol.Presence
	// TakenOver is true when the key was ours and another process took it.
	TakenOver bool
}

func (e *DuplicateError) Error() string {
	verb := "is already announced by"
	if e.TakenOver {
		verb = "was taken over by"
	}
	return fmt.Sprintf("presence key %q %s another live agent (host %s, pid %d, started %s): "+
		"give this agent another id or stop the other one",
		e.Key, verb, e.Other.Host, e.Other.PID, e.Other.StartedAt.Format(time.RFC3339))
}

// ErrStaleKey is returned by Start when an existing key neither changed nor
// expired within the TTL plus a second: the bucket's TTL is not what the
// Announcer was told, or the server is not expiring keys.
var ErrStaleKey = errors.New("presence key neither refreshed nor expired within its TTL")

// Announcer owns an agent's presence key: Start announces it, a goroutine
// heartbeats it, Stop deletes it.
type Announcer struct {
	kv  jetstream.KeyValue
	cfg AnnouncerConfig
	key string

	mu  sync.Mutex // serialises writes to the key and guards rev
	rev uint64     // revision of our last successful write

	usage    *Usage   // processUsage; a test's own elsewhere
	lastUtil *float64 // the utilisation reported last; guarded by mu

	cancel context.CancelFunc
	done   chan struct{}
	err    error // why the heartbeat loop stopped; read after done is closed
}

// NewAnnouncer checks cfg and returns an Announcer for the presence bucket kv.
func NewAnnouncer(kv jetstream.KeyValue, cfg AnnouncerConfig) (*Announcer, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	switch {
	case kv == nil:
		return nil, errors.New("presence: key-value bucket is required")
	case cfg.Presence == nil:
		return nil, errors.New("presence: Presence callback is required")
	case !protocol.ValidToken(cfg.Pool):
		return nil, fmt.Errorf("presence: pool %q is not a valid token", cfg.Pool)
	case !protocol.ValidToken(cfg.ID):
		return nil, fmt.Errorf("presence: id %q is not a valid token", cfg.ID)
	}
	return &Announcer{kv: kv, cfg: cfg, key: protocol.PresenceKey(cfg.Pool, cfg.ID), usage: &processUsage, done: make(chan struct{})}, nil
}

// Key is the presence key this Announcer owns.
func (a *Announcer) Key() string { return a.key }

// Start announces the presence and starts heartbeating until ctx ends or
// Stop is called. It returns a *DuplicateError if another live process holds
// the key. Start must be called once.
func (a *Announcer) Start(ctx context.Context) error {
	if a.cfg.TTL <= 0 {
		st, err := a.kv.Status(ctx)
		if err != nil {
			return fmt.Errorf("presence: read bucket status: %w", err)
		}
		a.cfg.TTL = st.TTL()
	}
	if a.cfg.TTL > 0 && 2*a.cfg.Interval >= a.cfg.TTL {
		return fmt.Errorf("presence: heartbeat interval %s must be less than half the presence TTL %s",
			a.cfg.Interval, a.cfg.TTL)
	}
	if err := a.announce(ctx); err != nil {
		return err
	}
	loopCtx, cancel := context.WithCancel(ctx)
	a.cancel = cancel
	go a.loop(loopCtx)
	return nil
}

// Done is closed when the heartbeat loop has stopped; Err then says why.
func (a *Announcer) Done() <-chan struct{} { return a.done }

// Err is nil while heartbeating, and after Stop; otherwise it is the reason
// the loop stopped (a *DuplicateError when the key was taken over).
func (a *Announcer) Err() error {
	select {
	case <-a.done:
		return a.err
	default:
		return nil
	}
}

// Stop ends the heartbeat loop and deletes the key if it is still ours.
func (a *Announcer) Stop(ctx context.Context) error {
	if a.cancel == nil {
		return nil
	}
	a.cancel()
	select {
	case <-a.done:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.rev == 0 {
		return nil
	}
	// LastRevision: never delete a key a duplicate took over from us.
	err := a.kv.Delete(ctx, a.key, jetstream.LastRevision(a.rev))
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return nil // expired or taken over: not ours to delete
	}
	if err != nil {
		return fmt.Errorf("presence: delete %s: %w", a.key, err)
	}
	a.rev = 0
	return nil
}

// announce wins the key with Create. If the key exists it reads it for a
// while (observe): a revision change means a live duplicate; no change means
// a crashed run whose key has not expired yet, so Create is retried until
// TTL+1s has passed.
func (a *Announcer) announce(ctx context.Context) error {
	giveUp := a.cfg.Now().Add(a.cfg.TTL + time.Second)
	var seen uint64
	for {
		a.mu.Lock()
		val, err := a.value()
		if err != nil {
			a.mu.Unlock()
			return err
		}
		rev, err := a.kv.Create(ctx, a.key, val)
		if err == nil {
			a.rev = rev
		}
		a.mu.Unlock()
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("presence: create %s: %w", a.key, err)
		}
		window := a.cfg.Interval + a.cfg.Interval/2
		obs, err := a.observe(ctx, window, seen)
		if err != nil {
			return err
		}
		switch {
		case obs.changed != nil:
			return &DuplicateError{Key: a.key, Other: decodePresence(obs.changed)}
		case obs.gone:
			a.cfg.Logger.Info().Str("key", a.key).Msg("previous presence key expired; announcing")
		default:
			seen = obs.rev
			if a.cfg.Now().After(giveUp) {
				return fmt.Errorf("presence: %s at revision %d: %w", a.key, seen, ErrStaleKey)
			}
			a.cfg.Logger.Info().Str("key", a.key).Uint64("revision", seen).
				Msg("presence key held but not refreshed (a previous run that crashed?); waiting for it to expire")
		}
	}
}

type observation struct {
	changed jetstream.KeyValueEntry // a put with a revision other than the first one seen
	gone    bool                    // the key is deleted, purged or expired
	rev     uint64                  // the revision seen, when unchanged
}

// pollsPerInterval is how many times per heartbeat interval observe reads
// the key, and minPoll the shortest time between two reads.
const (
	pollsPerInterval = 4
	minPoll          = 10 * time.Millisecond
)

// observe reads the key for window: at once, every Interval/4 and once more
// when the window ends. seen is a revision observed earlier (0 if none), so
// that a change between two observations counts as well.
//
// It reads with direct gets (the key's latest revision), never with a
// watch: a watch is a consumer, and a consumer's deliver subject is not
// within reach of NATS permissions, so an agent allowed to create one on
// the bucket could have the server deliver what it wrote to its key to any
// subject (docs/security.md). The agent's credential has no consumer on
// the presence bucket.
//
// What a read notices: every put takes a new revision, so any number of
// puts by another process between two reads shows as a changed revision
// (a duplicate); a delete, purge or expiry shows as the key missing (gone).
// What it cannot notice: a put followed by a delete or purge of the key
// between two reads (a watch saw the put and called it a duplicate). That
// is reported as gone, and Start's next Create takes the key; if the other
// process is still running, its next heartbeat finds our revision and it
// stops (Beat returns a taken-over *DuplicateError), so at most one live
// process keeps the key. An expiry cannot follow a put within one read
// interval: keys live for the TTL, more than two intervals.
func (a *Announcer) observe(ctx context.Context, window time.Duration, seen uint64) (observation, error) {
	every := max(a.cfg.Interval/pollsPerInterval, minPoll)
	end := time.Now().Add(window)
	var readErr error
	read := false
	for {
		last := !time.Now().Before(end)
		gctx, cancel := context.WithTimeout(ctx, a.cfg.Interval)
		e, err := a.kv.Get(gctx, a.key)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			return observation{gone: true}, nil
		case err != nil:
			if ctx.Err() != nil {
				return observation{}, context.Cause(ctx)
			}
			// A read that failed (a server restarting) only makes the time
			// between two reads longer: revisions only grow.
			readErr = err
		default:
			read = true
			if seen != 0 && e.Revision() != seen {
				return observation{changed: e}, nil
			}
			seen = e.Revision()
		}
		if last {
			if !read {
				return observation{}, fmt.Errorf("presence: get %s: %w", a.key, readErr)
			}
			return observation{rev: seen}, nil
		}
		t := time.NewTimer(min(every, time.Until(end)))
		select {
		case <-ctx.Done():
			t.Stop()
			return observation{}, context.Cause(ctx)
		case <-t.C:
		}
	}
}

func (a *Announcer) loop(ctx context.Context) {
	defer close(a.done)
	t := time.NewTicker(a.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// A beat whose reply is lost (the server restarted under it)
			// must not hold the next one back past the TTL: give it one
			// interval. If it landed after all, the next beat adopts it.
			bctx, cancel := context.WithTimeout(ctx, a.cfg.Interval)
			err := a.Beat(bctx)
			cancel()
			if err != nil {
				var dup *DuplicateError
				if errors.As(err, &dup) {
					a.err = err
					return
				}
				// Anything else is transient: the next beat retries, and if
				// the key expires meanwhile it is re-created.
				if ctx.Err() == nil {
					a.cfg.Logger.Warn().Err(err).Str("key", a.key).Msg("presence heartbeat failed")
				}
			}
		}
	}
}

// Beat writes a heartbeat now, e.g. right after the agent started draining.
// It returns a *DuplicateError if the key was taken over.
func (a *Announcer) Beat(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	val, err := a.value()
	if err != nil {
		return err
	}
	rev, err := a.kv.Update(ctx, a.key, val, a.rev)
	if err == nil {
		a.rev = rev
		return nil
	}
	if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return fmt.Errorf("presence: update %s: %w", a.key, err)
	}
	e, err := a.kv.Get(ctx, a.key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		// Expired (we were paused or cut off longer than the TTL): take it back.
		rev, err := a.kv.Create(ctx, a.key, val)
		if errors.Is(err, jetstream.ErrKeyExists) {
			if e, gerr := a.kv.Get(ctx, a.key); gerr == nil {
				return &DuplicateError{Key: a.key, Other: decodePresence(e), TakenOver: true}
			}
			return fmt.Errorf("presence: re-create %s: %w", a.key, err)
		}
		if err != nil {
			return fmt.Errorf("presence: re-create %s: %w", a.key, err)
		}
		a.rev = rev
		a.cfg.Logger.Warn().Str("key", a.key).Msg("presence key had expired; re-announced")
		return nil
	case err != nil:
		return fmt.Errorf("presence: get %s: %w", a.key, err)
	}
	other := decodePresence(e)
	if a.isOurs(other) {
		// Our own earlier write whose reply was lost: adopt its revision.
		a.rev = e.Revision()
		return nil
	}
	return &DuplicateError{Key: a.key, Other: other, TakenOver: true}
}

// value encodes the next heartbeat. Callers hold a.mu.
func (a *Announcer) value() ([]byte, error) {
	p := a.cfg.Presence()
	p.HeartbeatAt = a.cfg.Now().UTC()
	if p.HeartbeatInterval == 0 {
		p.HeartbeatInterval = protocol.Duration(a.cfg.Interval)
	}
	if p.Utilisation == nil {
		p.Utilisation = a.utilisation(a.usage.Sample(time.Now()))
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("presence: encode: %w", err)
	}
	return b, nil
}

// UtilisationStep is how far the sampled utilisation must move before a
// heartbeat reports the new value: a record that does not change between
// heartbeats is a cheap liveness refresh for every reader (View:
// Change.Beat), and CPU use sampled over one interval jitters by a few
// percent even when the agent is idle. Health only compares utilisation
// with a threshold (utilisation_ok, default 0.8).
const UtilisationStep = 0.05

// utilisation is what a heartbeat reports for the sample u: u in whole
// percent, unless the value reported last is within UtilisationStep of it.
// Callers hold a.mu.
func (a *Announcer) utilisation(u *float64) *float64 {
	if u == nil {
		return a.lastUtil
	}
	if a.lastUtil != nil && math.Abs(*u-*a.lastUtil) < UtilisationStep {
		return a.lastUtil
	}
	v := math.Round(*u*100) / 100
	a.lastUtil = &v
	return a.lastUtil
}

// isOurs tells our own value from a duplicate's: same host, pid and start.
func (a *Announcer) isOurs(p protocol.Presence) bool {
	me := a.cfg.Presence()
	return p.Host == me.Host && p.PID == me.PID && p.StartedAt.Equal(me.StartedAt)
}

func decodePresence(e jetstream.KeyValueEntry) protocol.Presence {
	var p protocol.Presence
	_ = json.Unmarshal(e.Value(), &p) // a foreign value still yields a DuplicateError, just less detailed
	return p
}

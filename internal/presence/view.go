package presence

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/watch"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Change is one update a View saw.
type Change struct {
	Key      string
	Presence protocol.Presence
	// Gone is true when the key was deleted or expired.
	Gone bool
	// Expired is true when the bucket's TTL removed the key (the agent
	// stopped heartbeating), as opposed to a clean delete on shutdown.
	Expired bool
	// Resync is true when the change was found by re-reading the bucket
	// after a gap in the watch (see View.Settled before judging from it).
	Resync bool
	// Beat is true when the record differs from the agent's previous one
	// only in heartbeat_at: a liveness refresh. Presence is then the
	// previous record with the new HeartbeatAt, not decoded again.
	Beat bool
}

// View keeps the present agents in memory from a watch of the bucket
// (internal/watch): after any gap (server restart, reconnect, a stalled
// watcher) it re-reads the bucket before it calls itself fresh again, and
// reports what changed meanwhile.
type View struct {
	w   *watch.Watch
	log zerolog.Logger

	mu     sync.RWMutex
	agents map[string]protocol.Presence
	// shapes holds each agent's last record without its dynamic members
	// (nil: it could not be walked), and buf the next record's; only the
	// watch goroutine uses them (decode).
	shapes   map[string][]byte
	buf      []byte
	onChange []func(Change)
	sinks    []Sink

	shards   int            // task shards, for validation; 0: unknown
	events   EventPublisher // rejected records are reported here; nil: logged only
	rejects  chan protocol.Event
	rejected atomic.Uint64
}

// EventPublisher publishes an event (internal/events.Publisher is one).
type EventPublisher interface {
	Publish(ctx context.Context, e protocol.Event) error
}

// ViewOption configures a View.
type ViewOption func(*View)

// WithTaskShards gives the deployment's task shard count, so that a
// record's task subject and stream are checked against the agent's own
// shard (protocol.ValidatePresence). Without it any shard is accepted as
// long as subject and stream agree.
func WithTaskShards(n int) ViewOption { return func(v *View) { v.shards = n } }

// WithEvents reports every rejected presence record as a presence_rejected
// event through p.
func WithEvents(p EventPublisher) ViewOption { return func(v *View) { v.events = p } }

// Sink keeps its own index of the present agents (selection.Selector is
// one): Observe for every presence stored, Forget for every agent gone.
type Sink interface {
	Observe(protocol.Presence)
	Forget(protocol.Presence)
}

// NewView binds a view to the presence bucket. Call Run to start watching.
//
// Every record is validated (protocol.ValidatePresence) before it is used:
// one whose key, task subject, task stream or consumer is not exactly what
// its agent's pool and id derive is rejected — not stored, not fed, not
// reported as a change, so it is never used for selection or failover —
// and raises a presence_rejected event (WithEvents). A rejected record
// that overwrote a valid one leaves the valid one in the view: the forger
// neither routes the agent's tasks nor makes it look gone.
func NewView(ctx context.Context, js jetstream.JetStream, log zerolog.Logger, opts ...ViewOption) (*View, error) {
	w, err := watch.New(ctx, js, protocol.BucketPresence, watch.Config{Logger: log})
	if err != nil {
		return nil, fmt.Errorf("presence view: %w", err)
	}
	v := &View{w: w, log: log, agents: map[string]protocol.Presence{}, shapes: map[string][]byte{}}
	for _, o := range opts {
		o(v)
	}
	return v, nil
}

// Rejected counts the presence records rejected so far.
func (v *View) Rejected() uint64 { return v.rejected.Load() }

// OnChange registers f to be called (from the watch goroutine) on every
// change after the initial state, re-sync differences included. Register
// before Run.
func (v *View) OnChange(f func(Change)) { v.onChange = append(v.onChange, f) }

// Feed registers s to be told (from the watch goroutine) of every presence
// the view applies, the initial state included, so that s never needs a
// copy of the view. Register before Run.
func (v *View) Feed(s Sink) { v.sinks = append(v.sinks, s) }

// Ready is closed once the initial state has been loaded.
func (v *View) Ready() <-chan struct{} { return v.w.Ready() }

// Fresh reports whether the view is complete now: loaded, and no gap in
// the watch since the last re-sync.
func (v *View) Fresh() bool { return v.w.Fresh() }

// LastGapEnd is when the view was last re-synced after a gap; zero if
// there was none.
func (v *View) LastGapEnd() time.Time { return v.w.LastGapEnd() }

// Settled reports whether the view is fresh and has been for at least d
// since the last gap ended. Judge an agent gone only from a view settled
// for one presence TTL: after a gap every live agent has then had a
// heartbeat seen.
func (v *View) Settled(d time.Duration, now time.Time) bool { return v.w.Settled(d, now) }

// Status is the underlying watch's status.
func (v *View) Status() watch.Status { return v.w.Status() }

// Run watches the bucket until ctx ends. Gaps are re-synced, never
// returned as errors.
func (v *View) Run(ctx context.Context) error {
	if v.events != nil {
		v.rejects = make(chan protocol.Event, 64)
		done := make(chan struct{})
		defer func() { <-done }()
		go func() { defer close(done); v.publishRejects(ctx) }()
	}
	return v.w.Run(ctx, func(e watch.Event) {
		c, ok := v.apply(e)
		if !ok {
			return
		}
		v.feed(c)
		if !e.Initial {
			for _, f := range v.onChange {
				f(c)
			}
		}
	})
}

// feed tells the sinks of c.
func (v *View) feed(c Change) {
	if c.Presence.ID == "" {
		return // undecodable, or gone without ever being known
	}
	for _, s := range v.sinks {
		if c.Gone {
			s.Forget(c.Presence)
		} else {
			s.Observe(c.Presence)
		}
	}
}

// apply records e; false when e is not usable (undecodable or rejected).
func (v *View) apply(e watch.Event) (Change, bool) {
	c := Change{Key: e.Key, Resync: e.Resync}
	if e.Gone() {
		v.mu.Lock()
		defer v.mu.Unlock()
		c.Gone = true
		c.Presence = v.agents[e.Key]
		// A TTL expiry arrives as a purge marker; a clean shutdown deletes.
		// A key a re-sync found missing counts as expired.
		c.Expired = e.Op == jetstream.KeyValuePurge
		delete(v.agents, e.Key)
		delete(v.shapes, e.Key)
		return c, true
	}
	val := e.Entry.Value()
	p, beat, err := v.decode(e.Key, val)
	if err != nil {
		v.reject(e, err)
		return c, false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.agents[e.Key] = p
	c.Presence, c.Beat = p, beat
	return c, true
}

// decode returns the record val holds: the agent's previous one with the
// new dynamic members (counters, load, heartbeat_at) when nothing else
// changed (refresh: the rest was decoded and validated when it last
// changed; beat when only heartbeat_at moved), else val decoded and
// validated, its shape kept for the next. Only the watch goroutine calls
// it, and only it writes agents.
func (v *View) decode(key string, val []byte) (p protocol.Presence, beat bool, err error) {
	p, beat, shape, ok := refresh(v.agents[key], v.shapes[key], val, v.buf[:0])
	if shape != nil {
		v.buf = shape
	}
	if ok {
		return p, beat, nil
	}
	if err := json.Unmarshal(val, &p); err != nil {
		return p, false, &protocol.PresenceError{Key: key, Reason: "undecodable", Detail: err.Error()}
	}
	if err := protocol.ValidatePresence(key, p, v.shards); err != nil {
		return p, false, err
	}
	v.shapes[key] = bytes.Clone(shape)
	return p, false, nil
}

// reject logs a record that is not used and queues its event.
func (v *View) reject(e watch.Event, err error) {
	v.rejected.Add(1)
	reason := "invalid"
	var pe *protocol.PresenceError
	if errors.As(err, &pe) {
		reason = pe.Reason
	}
	v.log.Warn().Err(err).Str("key", e.Key).Uint64("revision", e.Entry.Revision()).Str("reason", reason).
		Msg("presence record rejected: not used for selection or failover")
	if v.rejects == nil {
		return
	}
	ev := protocol.Event{Kind: protocol.EventPresenceRejected, ID: fmt.Sprintf("presence-%d", e.Entry.Revision()),
		Reason: err.Error(), Data: map[string]string{"reason": reason, "key": e.Key}}
	select {
	case v.rejects <- ev:
	default:
		v.log.Warn().Str("key", e.Key).Msg("presence_rejected event dropped: too many rejections at once")
	}
}

// publishRejects publishes rejection events off the watch goroutine, so a
// slow or unreachable event stream never holds the view up.
func (v *View) publishRejects(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-v.rejects:
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err := v.events.Publish(pctx, ev); err != nil && ctx.Err() == nil {
				v.log.Warn().Err(err).Str("key", ev.Data["key"]).Msg("presence_rejected event not published")
			}
			cancel()
		}
	}
}

// Agents returns the present agents sorted by pool then id.
func (v *View) Agents() []protocol.Presence {
	v.mu.RLock()
	out := make([]protocol.Presence, 0, len(v.agents))
	for _, p := range v.agents {
		out = append(out, p)
	}
	v.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Pool != out[j].Pool {
			return out[i].Pool < out[j].Pool
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Get returns the agent with presence key key (protocol.PresenceKey), if
// present.
func (v *View) Get(key string) (protocol.Presence, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	p, ok := v.agents[key]
	return p, ok
}

// Pool returns the present agents of one pool.
func (v *View) Pool(pool string) []protocol.Presence {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var out []protocol.Presence
	for _, p := range v.agents {
		if p.Pool == pool {
			out = append(out, p)
		}
	}
	return out
}

// List reads the present agents once, without a running view (for the CLI).
func List(ctx context.Context, js jetstream.JetStream) ([]protocol.Presence, error) {
	v, err := NewView(ctx, js, zerolog.Nop())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- v.Run(ctx) }()
	select {
	case <-v.Ready():
		cancel()
		<-done
		return v.Agents(), nil
	case err := <-done:
		return nil, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

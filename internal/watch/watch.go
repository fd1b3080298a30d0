package watch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Event is one change a Watch reports.
type Event struct {
	// Key of the entry.
	Key string
	// Entry is the stored value; nil when the key is gone.
	Entry jetstream.KeyValueEntry
	// Op is KeyValuePut, KeyValueDelete (a clean delete) or KeyValuePurge
	// (a purge, a TTL expiry, or a key found missing by a re-sync).
	Op jetstream.KeyValueOp
	// Initial is true for the entries of the first full read.
	Initial bool
	// Resync is true for differences found by re-reading the bucket after a
	// gap: a key that changed or appeared while the watch could not see, or
	// (Op KeyValuePurge, Entry nil) one that disappeared meanwhile.
	Resync bool
}

// Gone reports whether the key was removed.
func (e Event) Gone() bool { return e.Op != jetstream.KeyValuePut }

// Config configures a Watch.
type Config struct {
	// Keys, when set, restricts the watch to the keys matching these
	// filters (KV key syntax: "a.b", "a.*", "a.>"); the re-sync reads and
	// the gap probe look at those keys only. Defaults to every key.
	Keys []string
	// Synced, when set, is called from the watch goroutine after every
	// full read has been reported: the first (after the Initial events,
	// as a KV watcher's nil marker) and each re-sync after a gap.
	Synced func(resync bool)
	// Heartbeat is how long the watch may go without delivering anything
	// before it asks the server whether it missed something (the bucket's
	// last sequence against the last revision seen); a watcher found behind
	// that delivers nothing for another heartbeat is taken for stalled.
	// Defaults to 1s.
	Heartbeat time.Duration
	// Backoff is the wait between attempts to re-read the bucket while the
	// server is unreachable. Defaults to 100ms.
	Backoff time.Duration
	// Logger receives gap and re-sync notices. Defaults to a no-op logger.
	Logger zerolog.Logger
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	c.Keys = append([]string(nil), c.Keys...)
	if c.Heartbeat <= 0 {
		c.Heartbeat = time.Second
	}
	if c.Backoff <= 0 {
		c.Backoff = 100 * time.Millisecond
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Status is what a Watch says of its own view.
type Status struct {
	// Fresh is true when the view is complete: the first read is done and
	// no gap has begun since the last re-sync.
	Fresh bool
	// GapStarted is when the current or last gap began; zero if none.
	GapStarted time.Time
	// GapEnded is when the last gap ended (its re-sync completed); zero if
	// none. While a gap is open it is before GapStarted.
	GapEnded time.Time
	// Resyncs counts completed re-syncs after gaps.
	Resyncs int
}

// Watch follows every key of one bucket (or those Config.Keys names). See
// the package doc.
type Watch struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	stream string
	cfg    Config
	// probeStream is the bucket's stream, kept for the probes of a
	// filtered watch (a direct get per filter, no stream info).
	probeStream jetstream.Stream

	ready     chan struct{}
	readyOnce sync.Once

	mu     sync.Mutex
	status Status
	synced bool // the first read is done
}

// New binds a watch to bucket. Run starts it.
func New(ctx context.Context, js jetstream.JetStream, bucket string, cfg Config) (*Watch, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	return ForKV(js, kv, cfg), nil
}

// ForKV binds a watch to a bucket the caller has open. Run starts it.
func ForKV(js jetstream.JetStream, kv jetstream.KeyValue, cfg Config) *Watch {
	return &Watch{js: js, kv: kv, stream: "KV_" + kv.Bucket(), cfg: cfg.withDefaults(), ready: make(chan struct{})}
}

// Ready is closed once the first full read of the bucket has been reported.
func (w *Watch) Ready() <-chan struct{} { return w.ready }

// Status returns the watch's status now.
func (w *Watch) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status
}

// Fresh reports whether the view is complete now (see Status.Fresh).
func (w *Watch) Fresh() bool { return w.Status().Fresh }

// LastGapEnd is when the last gap's re-sync completed; zero if there was
// no gap.
func (w *Watch) LastGapEnd() time.Time { return w.Status().GapEnded }

// Settled reports whether the view is fresh and has been for at least d
// since the last gap ended (or there never was one). A supervisor judges
// agents gone only from a settled view: after a gap, one presence TTL lets
// every live agent write a heartbeat the view sees.
func (w *Watch) Settled(d time.Duration, now time.Time) bool {
	s := w.Status()
	return s.Fresh && (s.GapEnded.IsZero() || now.Sub(s.GapEnded) >= d)
}

// gap records that the view may be missing changes from now on.
func (w *Watch) gap(why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.status.Fresh {
		return
	}
	w.status.Fresh = false
	w.status.GapStarted = w.cfg.Now()
	w.cfg.Logger.Warn().Str("stream", w.stream).Str("why", why).Msg("watch gap: the view is stale until re-synced")
}

// fresh records a completed full read.
func (w *Watch) fresh(resync bool) {
	w.mu.Lock()
	if resync {
		w.status.GapEnded = w.cfg.Now()
		w.status.Resyncs++
		w.cfg.Logger.Info().Str("stream", w.stream).Dur("gap", w.status.GapEnded.Sub(w.status.GapStarted)).
			Msg("watch re-synced after a gap")
	}
	w.status.Fresh = true
	w.synced = true
	w.mu.Unlock()
	if w.cfg.Synced != nil {
		w.cfg.Synced(resync)
	}
	w.readyOnce.Do(func() { close(w.ready) })
}

// errResync ends a streaming phase: the view must be re-read.
var errResync = errors.New("re-sync needed")

// Run reports the bucket's keys to handle, from the watch goroutine, until
// ctx ends: first every key (Initial), then every change, and after every
// gap the differences found by re-reading the bucket (Resync). It returns
// nil when ctx ends; transient failures are retried, never returned.
func (w *Watch) Run(ctx context.Context, handle func(Event)) error {
	nc := w.js.Conn()
	conn := nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CONNECTED, nats.CLOSED)
	defer nc.RemoveStatusListener(conn)
	known := map[string]uint64{} // key → revision reported
	// last is the position the view is known to cover: the highest
	// revision delivered, or (unfiltered) the stream's last sequence when
	// the last full read began, which that read covers even if the message
	// there was removed before anyone could deliver it.
	var last uint64
	for ctx.Err() == nil {
		if !nc.IsConnected() {
			// A read now would only wait out its request timeout: wait
			// for the connection instead (or retry after a backoff).
			w.gap("not connected")
			select {
			case <-ctx.Done():
			case <-conn:
			case <-time.After(w.cfg.Backoff):
			}
			continue
		}
		kw, err := w.sync(ctx, known, &last, handle, conn)
		if err != nil {
			if ctx.Err() == nil {
				w.gap(err.Error())
				w.cfg.Logger.Debug().Err(err).Str("stream", w.stream).Msg("watch: bucket read failed; retrying")
				sleep(ctx, w.cfg.Backoff)
			}
			continue
		}
		err = w.follow(ctx, kw, known, &last, handle, conn)
		_ = kw.Stop()
		if err != nil && ctx.Err() == nil {
			w.gap(err.Error())
		}
	}
	return nil
}

// sync reads the whole bucket with a new watcher, reports what differs from
// known, and returns the watcher positioned after that read.
func (w *Watch) sync(ctx context.Context, known map[string]uint64, last *uint64, handle func(Event),
	conn <-chan nats.Status) (jetstream.KeyWatcher, error) {
	w.mu.Lock()
	first := !w.synced
	w.mu.Unlock()
	// An unfiltered probe compares the stream's last sequence with the
	// revisions delivered. When the newest message was removed before any
	// watcher could deliver it (an entry whose TTL expired without a
	// marker, a limit marker that aged out, PurgeDeletes), no revision ever
	// reaches that sequence, and each quiet heartbeat would re-sync again.
	// The watcher started below delivers every entry stored at or before
	// the sequence read here, so once it has been read, the view covers it.
	// (A filtered probe looks up its keys' newest stored messages, which a
	// read always delivers.)
	var covered uint64
	if len(w.cfg.Keys) == 0 {
		lctx, cancel := context.WithTimeout(ctx, 4*w.cfg.Heartbeat)
		seq, err := w.lastSeq(lctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("last sequence of %s before reading it: %w", w.stream, err)
		}
		covered = seq
	}
	var kw jetstream.KeyWatcher
	var err error
	if len(w.cfg.Keys) > 0 {
		// A copy: nats.go rewrites the filters it is given in place.
		kw, err = w.kv.WatchFiltered(ctx, append([]string(nil), w.cfg.Keys...))
	} else {
		kw, err = w.kv.WatchAll(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", w.stream, err)
	}
	snapshot := map[string]jetstream.KeyValueEntry{}
	var maxRev uint64
	// A read that stops delivering (the server went away mid-read) is
	// abandoned after a few heartbeats and started again.
	stall := time.NewTimer(4 * w.cfg.Heartbeat)
	defer stall.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			_ = kw.Stop()
			return nil, ctx.Err()
		case <-stall.C:
			_ = kw.Stop()
			return nil, fmt.Errorf("reading %s stalled", w.stream)
		case s := <-conn:
			if s != nats.CONNECTED {
				_ = kw.Stop()
				return nil, fmt.Errorf("connection %s while reading %s", s, w.stream)
			}
		case e, ok := <-kw.Updates():
			if !ok {
				return nil, fmt.Errorf("watcher of %s closed while reading", w.stream)
			}
			if e == nil {
				done = true
				continue
			}
			maxRev = max(maxRev, e.Revision())
			if e.Operation() == jetstream.KeyValuePut {
				snapshot[e.Key()] = e
			} else {
				delete(snapshot, e.Key())
			}
			stall.Reset(4 * w.cfg.Heartbeat)
		}
	}
	for k, e := range snapshot {
		if known[k] != e.Revision() {
			known[k] = e.Revision()
			handle(Event{Key: k, Entry: e, Op: jetstream.KeyValuePut, Initial: first, Resync: !first})
		}
	}
	for k := range known {
		if _, ok := snapshot[k]; !ok {
			delete(known, k)
			handle(Event{Key: k, Op: jetstream.KeyValuePurge, Resync: true})
		}
	}
	*last = max(*last, maxRev, covered)
	w.fresh(!first)
	return kw, nil
}

// follow reports changes from kw until ctx ends or a gap is detected
// (errResync and the like).
func (w *Watch) follow(ctx context.Context, kw jetstream.KeyWatcher, known map[string]uint64, last *uint64,
	handle func(Event), conn <-chan nats.Status) error {
	tick := time.NewTicker(w.cfg.Heartbeat)
	defer tick.Stop()
	lastDelivery := w.cfg.Now()
	// A probe that finds the bucket beyond what was delivered is not proof
	// of a stall: a put stored just before the probe may still be on its
	// way, or waiting in kw.Updates() while this goroutine probes. behind
	// is the sequence such a probe found (zero: none pending) and
	// behindDeliveries the deliveries counted then; only a watcher that
	// delivers nothing for the next heartbeat and is still behind is taken
	// for stalled.
	var behind, deliveries, behindDeliveries uint64
	for {
		select {
		case <-ctx.Done():
			return nil
		case s := <-conn:
			switch s {
			case nats.CONNECTED:
				// Reconnected: whatever happened meanwhile is read again.
				return fmt.Errorf("%w: reconnected", errResync)
			default:
				w.gap("connection " + s.String())
			}
		case e, ok := <-kw.Updates():
			if !ok {
				return fmt.Errorf("%w: watcher closed", errResync)
			}
			if e == nil {
				continue
			}
			lastDelivery = w.cfg.Now()
			deliveries++
			*last = max(*last, e.Revision())
			if e.Operation() == jetstream.KeyValuePut {
				known[e.Key()] = e.Revision()
				handle(Event{Key: e.Key(), Entry: e, Op: jetstream.KeyValuePut})
			} else {
				delete(known, e.Key())
				handle(Event{Key: e.Key(), Op: e.Operation()})
			}
		case <-tick.C:
			if behind != 0 {
				if *last < behind && deliveries == behindDeliveries {
					return fmt.Errorf("%w: watcher of %s silent at revision %d for a heartbeat, bucket at %d",
						errResync, w.stream, *last, behind)
				}
				// It delivered since: caught up, or still moving.
				behind = 0
			}
			if w.cfg.Now().Sub(lastDelivery) < w.cfg.Heartbeat && w.Fresh() {
				continue
			}
			seq, err := w.probe(ctx)
			if err != nil {
				w.gap(err.Error())
				continue
			}
			if !w.Fresh() {
				// A gap (disconnect, failed probe) that ended without a
				// reconnect event reaching us: read again.
				return fmt.Errorf("%w: server reachable again", errResync)
			}
			if seq > *last {
				behind, behindDeliveries = seq, deliveries
			}
		}
	}
}

// probe asks the server for the bucket's last sequence (a filtered watch:
// the last of its keys'), after a silent heartbeat: one beyond what was
// delivered means the watcher is behind, stalled if it stays so (follow).
func (w *Watch) probe(ctx context.Context) (uint64, error) {
	pctx, cancel := context.WithTimeout(ctx, w.cfg.Heartbeat)
	defer cancel()
	seq, err := w.lastSeq(pctx)
	if err != nil {
		return 0, fmt.Errorf("probe %s: %w", w.stream, err)
	}
	return seq, nil
}

// lastSeq is the sequence of the newest message the watch should have
// seen.
func (w *Watch) lastSeq(ctx context.Context) (uint64, error) {
	if len(w.cfg.Keys) == 0 {
		st, err := w.js.Stream(ctx, w.stream)
		if err != nil {
			return 0, err
		}
		return st.CachedInfo().State.LastSeq, nil
	}
	if w.probeStream == nil {
		st, err := w.js.Stream(ctx, w.stream)
		if err != nil {
			return 0, err
		}
		w.probeStream = st // only the watch goroutine probes
	}
	var seq uint64
	for _, k := range w.cfg.Keys {
		m, err := w.probeStream.GetLastMsgForSubject(ctx, "$KV."+w.kv.Bucket()+"."+k)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, err
		}
		seq = max(seq, m.Sequence)
	}
	return seq, nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

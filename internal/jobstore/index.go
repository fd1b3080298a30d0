package jobstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/wardenhq/warden/streams"
)

// An Index keeps every job's entry (JobEntry: id, state, desired, created,
// updated, expires_at, revision) in memory, for a long-running process
// that lists jobs often (the API: the dashboard lists on every refresh).
// It is built by the listing's header scan (ScanJobs) and kept current by
// an ordered, headers-only consumer of the job keys that goes on from the
// scan's last sequence: a write replaces its job's entry, a KV delete or
// purge and the server's TTL-expiry marker (Removed) remove it. A Store
// given the index (UseIndex) answers List from it (index_list.go), then
// reads only the page's records, as a scan-backed listing does.
//
// Guarantees:
//   - A listing answered by the index is the listing a scan started at the
//     same moment would give: same page, order, cursors, Matched and
//     Counts. Before answering, it asks the stream for its last sequence
//     and makes sure the index has applied every job write up to it
//     (waiting at most IndexConfig.CatchUp for the follower).
//   - Otherwise the listing scans: before the first build, while the index
//     is rebuilt, and when the follower is behind or an error ended it. A
//     stale or partial index is never answered from.
//   - Any failure of the follower (an error, the connection lost, a
//     follower found behind that applies nothing for IndexConfig.Stall,
//     the stream purged whole or made again) drops the index and rebuilds
//     it from a new scan, after a backoff.
//     Run owns every goroutine it starts and returns after they end.
//
// Memory: the index keeps entries, never records: about 220 bytes a job
// as built (TestIndexEntryCost): a 144-byte slot (id, state and desired
// as string headers, the states interned to the package's constants, three
// times, the revision), the id's bytes (24 for "job-" and a NUID), its map
// entry and its place in the sorted order. 20,000 retained jobs take about
// 4.4 MB, 200,000 about 44 MB. Removed jobs' places are compacted away;
// the map, as Go maps do, keeps its high-water size until a rebuild.
type Index struct {
	store *Store
	js    jetstream.JetStream
	cfg   IndexConfig

	mu    sync.RWMutex
	ready bool   // built, and followed since; false from any failure
	gen   uint64 // bumped by every build
	byID  map[string]*slot
	// order holds every slot, removed ones too until compacted, sorted so
	// that the newest job (compareEntries) is last: new jobs append.
	order   []*slot
	removed int // removed slots still in order
	counts  map[JobState]int
	// covered is the stream sequence up to which every job write has
	// been applied; progress is when it last moved.
	covered  uint64
	progress time.Time
	// behind is when a listing found the follower short of a write since
	// it last moved (zero: none did). A stall is judged from the later of
	// the two: from progress alone, a follower that had nothing to apply
	// for longer than Stall was taken for stalled at its first slow
	// delivery, and the whole index rebuilt.
	behind time.Time
	// oldest is a revision no live entry is below (checkHead): the
	// least at the build, raised when found stale; walked is when it
	// was last taken.
	oldest uint64
	walked time.Time
	// changed is closed (and cleared) when covered moves or the index is
	// dropped; made by a waiting listing.
	changed chan struct{}
	// abort ends the follower running now (a stall).
	abort context.CancelCauseFunc

	builds, indexed, fallbacks atomic.Uint64
}

// IndexConfig configures an Index.
type IndexConfig struct {
	// CatchUp bounds what a listing spends making sure the index holds
	// every job write stored before it began (the stream's last sequence,
	// and the follower applying what it has not yet); past it the listing
	// scans instead. Defaults to 250ms.
	CatchUp time.Duration
	// Stall is how long a follower a listing found behind may go without
	// applying a write before the index is rebuilt. Defaults to 2s.
	Stall time.Duration
	// Backoff is the wait before a rebuild after a failure; it doubles
	// with each failure in a row, up to MaxBackoff. Defaults to 250ms.
	Backoff time.Duration
	// MaxBackoff bounds Backoff. Defaults to 10s.
	MaxBackoff time.Duration
	// Logger receives build and failure notices. Defaults to none.
	Logger zerolog.Logger
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// WithDefaults fills every unset field.
func (c IndexConfig) WithDefaults() IndexConfig {
	if c.CatchUp <= 0 {
		c.CatchUp = 250 * time.Millisecond
	}
	if c.Stall <= 0 {
		c.Stall = 2 * time.Second
	}
	if c.Backoff <= 0 {
		c.Backoff = 250 * time.Millisecond
	}
	if c.MaxBackoff < c.Backoff {
		c.MaxBackoff = max(10*time.Second, c.Backoff)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// IndexStatus is what an Index says of itself.
type IndexStatus struct {
	// Ready: built and followed; listings may be answered from it.
	Ready bool
	// Entries is the number of jobs held.
	Entries int
	// Covered is the stream sequence up to which every job write has been
	// applied.
	Covered uint64
	// Builds counts completed builds: the first, then each rebuild.
	Builds uint64
	// Indexed and Fallbacks count listings answered from the index and by
	// a scan.
	Indexed, Fallbacks uint64
}

// Errors that end a follower (and make the index rebuild).
var (
	errIndexGap     = errors.New("job index: connection lost")
	errIndexStalled = errors.New("job index: follower behind and not moving")
)

// NewIndex returns an index of store's jobs, read through js. Run builds
// and keeps it; Store.UseIndex makes listings use it.
func NewIndex(store *Store, js jetstream.JetStream, cfg IndexConfig) *Index {
	return &Index{store: store, js: js, cfg: cfg.WithDefaults()}
}

// UseIndex has List answer from ix whenever it is current (nil: always
// scan). ix must index this store's bucket.
func (s *Store) UseIndex(ix *Index) { s.index.Store(ix) }

// Status returns the index's status now.
func (ix *Index) Status() IndexStatus {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return IndexStatus{Ready: ix.ready, Entries: len(ix.byID), Covered: ix.covered, Builds: ix.builds.Load(),
		Indexed: ix.indexed.Load(), Fallbacks: ix.fallbacks.Load()}
}

// Run builds the index and keeps it current until ctx ends, then drops it
// and returns. A failure drops the index and rebuilds it after a
// backoff; listings scan meanwhile. Run returns only once every goroutine
// it started has ended.
func (ix *Index) Run(ctx context.Context) {
	nc := ix.js.Conn()
	conn := nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CONNECTED, nats.CLOSED)
	defer nc.RemoveStatusListener(conn)
	log := ix.cfg.Logger.With().Str("component", "job_index").Logger()
	backoff := ix.cfg.Backoff
	for ctx.Err() == nil {
		if !nc.IsConnected() {
			select {
			case <-ctx.Done():
			case <-conn:
			case <-time.After(backoff):
			}
			continue
		}
		// Events from before this attempt say nothing about it.
		for drained := false; !drained; {
			select {
			case <-conn:
			default:
				drained = true
			}
		}
		start := ix.cfg.Now()
		built, err := ix.attempt(ctx, conn, log)
		ix.drop()
		if ctx.Err() != nil {
			break
		}
		if built && ix.cfg.Now().Sub(start) >= time.Minute {
			backoff = ix.cfg.Backoff
		}
		log.Warn().Err(err).Dur("retry_in", backoff).Msg("job index dropped: listings scan until it is rebuilt")
		sleep(ctx, backoff)
		backoff = min(2*backoff, ix.cfg.MaxBackoff)
	}
	ix.drop()
}

// attempt builds the index and follows the job keys until ctx ends or the
// follower fails; built says the index was installed.
func (ix *Index) attempt(ctx context.Context, conn <-chan nats.Status, log zerolog.Logger) (built bool, err error) {
	actx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel(nil)
		wg.Wait()
	}()
	ix.mu.Lock()
	ix.abort = cancel
	ix.mu.Unlock()
	// A lost connection ends the attempt: what was written meanwhile is
	// read again by the next build.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-actx.Done():
				return
			case s := <-conn:
				if s != nats.CONNECTED {
					cancel(fmt.Errorf("%w (%s)", errIndexGap, s))
					return
				}
			}
		}
	}()
	cause := func(err error) error {
		if c := context.Cause(actx); c != nil {
			return c
		}
		return err
	}

	start := ix.cfg.Now()
	entries, last, err := ix.store.scanJobs(actx, ix.js)
	if err != nil {
		return false, cause(err)
	}
	cons, err := ix.js.OrderedConsumer(actx, ix.store.stream, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{jobKeysFilter},
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       last + 1,
		HeadersOnly:       true,
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return false, cause(fmt.Errorf("follow job keys: %w", err))
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1000), jetstream.PullHeartbeat(5*time.Second))
	if err != nil {
		return false, cause(fmt.Errorf("follow job keys: %w", err))
	}
	defer func() {
		it.Stop()
		streams.DropConsumer(ctx, ix.js, ix.store.stream, cons)
	}()
	// Next blocks without a context: stop the iterator when actx ends.
	stop := context.AfterFunc(actx, it.Stop)
	defer stop()

	ix.install(entries, last)
	log.Info().Int("entries", len(entries)).Uint64("from_seq", last+1).Dur("took", ix.cfg.Now().Sub(start)).
		Msg("job index built; following job writes")
	for {
		m, err := it.Next()
		if err != nil {
			return true, cause(fmt.Errorf("follow job keys: %w", err))
		}
		if err := ix.apply(actx, m); err != nil {
			return true, cause(err)
		}
	}
}

// apply brings the index up to one message of the job keys.
func (ix *Index) apply(ctx context.Context, m jetstream.Msg) error {
	md, err := m.Metadata()
	if err != nil {
		return fmt.Errorf("follow job keys: %w", err)
	}
	id := strings.TrimPrefix(m.Subject(), jobKeysPrefix)
	h := m.Headers()
	var e JobEntry
	put := false
	if !Removed(h) {
		if e, put = entryFromHeaders(id, h, md); !put {
			// Written without the headers (an older version): read whole.
			if e, put, err = ix.store.legacyEntry(ctx, id); err != nil {
				return fmt.Errorf("read job %s written without headers: %w", id, err)
			}
		}
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if put {
		ix.put(e)
	} else {
		ix.remove(id, md.Sequence.Stream)
	}
	ix.advance(md.Sequence.Stream)
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

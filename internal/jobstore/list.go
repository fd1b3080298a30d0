package jobstore

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// Listing jobs without reading every record.
//
// A listing reads the job keys of the store's stream with an ordered,
// headers-only consumer that delivers the last message of each key
// (DeliverLastPerSubject): the server sends the record headers
// (protocol.HeaderRecordState, HeaderRecordCreated, ...) and no body, so
// filtering and ordering 20,000 jobs costs one pass over small messages and
// no JSON decoding. Only the records of the requested page are then read
// through the Store. A record written without the headers (by an older
// version) is read in full, once, to classify it.

// DefaultListLimit is the page size when ListFilter.Limit is zero.
const DefaultListLimit = 50

// MaxListLimit bounds one page.
const MaxListLimit = 1000

// ErrBadCursor: a ListFilter.Cursor that no listing produced.
var ErrBadCursor = errors.New("invalid page cursor")

// ListFilter narrows and pages a listing. Zero values mean no restriction.
type ListFilter struct {
	// States keeps jobs in any of these states.
	States []JobState
	// CreatedAfter keeps jobs accepted at or after this time.
	CreatedAfter time.Time
	// CreatedBefore keeps jobs accepted before this time.
	CreatedBefore time.Time
	// Limit is the page size. Defaults to DefaultListLimit, at most
	// MaxListLimit.
	Limit int
	// Cursor continues a listing after the last job of a previous page
	// (ListPage.Next).
	Cursor string
}

// JobEntry is what a listing knows of a job from its record's headers.
type JobEntry struct {
	ID      string    `json:"id"`
	State   JobState  `json:"state"`
	Desired JobState  `json:"desired,omitempty"`
	Created time.Time `json:"created_at"`
	// Updated is when the record was last written.
	Updated time.Time `json:"updated_at"`
	// ExpiresAt is when a finished job's record is removed (its retention
	// TTL); zero while the job runs or when it is kept for ever.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	Revision  uint64    `json:"revision"`
}

// ListedJob is one job of a page: its entry and its record.
type ListedJob struct {
	JobEntry
	// Job is the record, read through the Store; nil if the job went away
	// between the scan and the read (its retention ended).
	Job *Job `json:"job,omitempty"`
	// Steps are the job's steps, read with Job in one read (Store.Load), in
	// spec order; a step not yet materialised is missing.
	Steps []VersionedStep `json:"-"`
	// Unreadable is why the job's records could not be decoded (Job is
	// then nil): it is listed from its entry, and the others still are.
	Unreadable error `json:"-"`
}

// StepsDone counts the steps read with the job that are in a terminal
// state (from this one read: a job read again for its steps could be gone
// by then).
func (lj ListedJob) StepsDone() int {
	n := 0
	for _, st := range lj.Steps {
		if st.State.Terminal() {
			n++
		}
	}
	return n
}

// ListPage is one page of a listing, newest job first.
type ListPage struct {
	Jobs []ListedJob `json:"jobs"`
	// Next continues the listing; empty on the last page.
	Next string `json:"next,omitempty"`
	// Matched counts the jobs that pass the filter, on every page.
	Matched int `json:"matched"`
	// Counts counts every job in the store by state, ignoring the filter.
	Counts map[JobState]int `json:"counts"`
	// Scanned is the number of jobs considered: the job keys a scan read
	// (headers only), or the entries of the Index that answered.
	Scanned int `json:"scanned"`
}

// List returns one page of jobs, newest first (ties by id). js must reach
// the store's bucket: the scan runs a consumer on its stream. A Store given
// an Index (UseIndex) answers from it while it is current (see index.go)
// and scans otherwise; both give the same page, cursors and counts.
func (s *Store) List(ctx context.Context, js jetstream.JetStream, f ListFilter) (ListPage, error) {
	limit, after, err := f.paging()
	if err != nil {
		return ListPage{}, err
	}
	var page ListPage
	var sel []JobEntry
	if ix := s.index.Load(); ix == nil || !ix.page(ctx, f, limit, after, &page, &sel) {
		entries, err := s.ScanJobs(ctx, js)
		if err != nil {
			return ListPage{}, err
		}
		page, sel = pageOf(entries, f, limit, after)
	}
	page.Jobs = make([]ListedJob, len(sel))
	if err := s.readPage(ctx, sel, page.Jobs); err != nil {
		return ListPage{}, err
	}
	return page, nil
}

// paging is the filter's page size and the entry its cursor continues
// after (nil: from the newest).
func (f ListFilter) paging() (int, *JobEntry, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultListLimit
	}
	limit = min(limit, MaxListLimit)
	if f.Cursor == "" {
		return limit, nil, nil
	}
	c, err := decodeCursor(f.Cursor)
	if err != nil {
		return 0, nil, err
	}
	return limit, &c, nil
}

// pageOf selects a page from every job's entry: counts, matches, order
// and cursor. The records are read by the caller.
func pageOf(entries []JobEntry, f ListFilter, limit int, after *JobEntry) (ListPage, []JobEntry) {
	page := ListPage{Counts: map[JobState]int{}, Scanned: len(entries)}
	var matched []JobEntry
	for _, e := range entries {
		page.Counts[e.State]++
		if f.match(e) {
			matched = append(matched, e)
		}
	}
	page.Matched = len(matched)
	slices.SortFunc(matched, compareEntries)
	start := 0
	if after != nil {
		start, _ = slices.BinarySearchFunc(matched, *after, compareEntries)
		if start < len(matched) && matched[start].ID == after.ID {
			start++
		}
	}
	end := min(start+limit, len(matched))
	if start > end {
		start = end
	}
	sel := matched[start:end]
	if end < len(matched) && len(sel) > 0 {
		page.Next = encodeCursor(sel[len(sel)-1])
	}
	return page, sel
}

func (f ListFilter) match(e JobEntry) bool {
	if !f.wantsState(e.State) {
		return false
	}
	if !f.CreatedAfter.IsZero() && e.Created.Before(f.CreatedAfter) {
		return false
	}
	if !f.CreatedBefore.IsZero() && !e.Created.Before(f.CreatedBefore) {
		return false
	}
	return true
}

// wantsState says whether jobs in state s are listed.
func (f ListFilter) wantsState(s JobState) bool {
	return len(f.States) == 0 || slices.Contains(f.States, s)
}

// compareEntries orders newest first, then by id.
func compareEntries(a, b JobEntry) int {
	if c := b.Created.Compare(a.Created); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

// readPage reads the page's records concurrently, each job with its steps
// in one read: a job whose retention ends while the page is read is either
// read whole or not at all. Read apart (the job, then its steps for the
// listing's "steps done"), a job that expired between the two reads failed
// the whole listing with "not found" (21 of 503 listings with a 1 s
// retention and constant writes).
func (s *Store) readPage(ctx context.Context, sel []JobEntry, out []ListedJob) error {
	errs := make([]error, len(sel))
	sem := make(chan struct{}, stepReadConcurrency)
	var wg sync.WaitGroup
	for i, e := range sel {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			out[i].JobEntry = e
			snap, err := s.Load(ctx, e.ID)
			switch {
			case errors.Is(err, ErrNotFound):
			case errors.Is(err, ErrUndecodable):
				// One bad record failed the whole page (and the
				// overview, when it was the newest job's).
				out[i].Unreadable = err
			case err != nil:
				errs[i] = err
			default:
				out[i].Job, out[i].Steps = snap.Job, snap.Versioned()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// maxScanExtra is the least a scan reads past the stream's last write at
// its start (see ScanJobs); it reads as many as it has jobs if more.
const maxScanExtra = 10_000

// ScanJobs returns an entry for every job in the store, in no particular
// order, reading record headers only (see the comment at the top of this
// file). It reads what was stored when it started and what was written
// while it read, each job once at its newest.
func (s *Store) ScanJobs(ctx context.Context, js jetstream.JetStream) ([]JobEntry, error) {
	out, _, err := s.scanJobs(ctx, js)
	return out, err
}

// scanJobs is ScanJobs, and the stream sequence up to which it read every
// job write: the last message it received, or the stream's last sequence
// at its start if it received none. A reader that goes on from the next
// sequence misses no job write (an Index does).
func (s *Store) scanJobs(ctx context.Context, js jetstream.JetStream) ([]JobEntry, uint64, error) {
	stream := s.stream
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, 0, fmt.Errorf("list jobs: %w", err)
	}
	last := st.CachedInfo().State.LastSeq
	if st.CachedInfo().State.Msgs == 0 {
		return nil, last, nil
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{jobKeysFilter},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		HeadersOnly:    true,
		// An abandoned scan's consumer goes away soon; a finished one is
		// deleted below.
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return nil, 0, fmt.Errorf("list jobs: %w", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(2000))
	if err != nil {
		return nil, 0, fmt.Errorf("list jobs: %w", err)
	}
	defer func() {
		it.Stop()
		streams.DropConsumer(ctx, js, stream, cons)
	}()
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		return nil, last, nil
	}
	// Next blocks without a context: stop the iterator when ctx ends.
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()

	var out []JobEntry
	var legacy []string
	at := map[string]int{} // index in out of a job already read
	gone := 0              // entries of out removed during the scan (ID "")
	extra := 0             // writes read past the last at the start
	var reached uint64     // the sequence of the last message received
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil, 0, fmt.Errorf("list jobs: %w", ctx.Err())
			}
			return nil, 0, fmt.Errorf("list jobs: %w", err)
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, 0, fmt.Errorf("list jobs: %w", err)
		}
		reached = md.Sequence.Stream
		h := m.Headers()
		id := strings.TrimPrefix(m.Subject(), jobKeysPrefix)
		if i, seen := at[id]; seen {
			switch e, ok := entryFromHeaders(id, h, md); {
			case Removed(h):
				// Removed during the scan (its retention ended, or a
				// delete): the job is gone. Kept, it was counted in
				// Matched and Counts, and its page had a hole.
				out[i] = JobEntry{}
				delete(at, id)
				gone++
			case ok:
				// Rewritten during the scan: the newer write replaces it.
				out[i] = e
			}
		} else if !Removed(h) {
			e, ok := entryFromHeaders(id, h, md)
			if ok {
				at[id] = len(out)
				out = append(out, e)
			} else {
				legacy = append(legacy, id)
			}
		}
		// Read on past the stream's last write at the start until caught up:
		// a job rewritten during the scan lost its old record (history 1)
		// before the scan reached it, and its new one is past that point.
		// Stopping there left such jobs out (2956-2997 of 3000 with 200
		// being updated). Bounded, so a scan under heavy writes still ends.
		if md.Sequence.Stream > last {
			extra++
		}
		if md.NumPending == 0 || extra > max(maxScanExtra, len(out)) {
			break
		}
	}
	if gone > 0 {
		out = slices.DeleteFunc(out, func(e JobEntry) bool { return e.ID == "" })
	}
	if len(legacy) > 0 {
		more, err := s.legacyEntries(ctx, legacy)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, more...)
	}
	return out, reached, nil
}

// entryFromHeaders builds an entry from a record's headers; false when the
// record carries none (written before the headers existed).
func entryFromHeaders(id string, h map[string][]string, md *jetstream.MsgMetadata) (JobEntry, bool) {
	get := func(k string) string {
		if v := h[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	state := get(protocol.HeaderRecordState)
	created, err := time.Parse(time.RFC3339Nano, get(protocol.HeaderRecordCreated))
	if state == "" || err != nil {
		return JobEntry{}, false
	}
	e := JobEntry{
		ID: id, State: JobState(state), Desired: JobState(get(protocol.HeaderRecordDesired)),
		Created: created, Updated: md.Timestamp, Revision: md.Sequence.Stream,
	}
	if ttl := get("Nats-TTL"); ttl != "" {
		if d, ok := parseTTL(ttl); ok {
			e.ExpiresAt = md.Timestamp.Add(d)
		}
	}
	return e, true
}

// parseTTL reads a Nats-TTL header: a Go duration ("168h") or seconds;
// "never" and non-positive values mean no expiry.
func parseTTL(v string) (time.Duration, bool) {
	if d, err := time.ParseDuration(v); err == nil {
		return d, d > 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
		return time.Duration(n) * time.Second, true
	}
	return 0, false
}

// legacyEntry is the entry of job id, written without the headers a
// listing reads (an older version): its record read whole; ok is false if
// there is none.
func (s *Store) legacyEntry(ctx context.Context, id string) (e JobEntry, ok bool, err error) {
	j, rev, err := s.Job(ctx, id)
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrUndecodable) {
		// Not a job (an undecodable record failed every scan, and the
		// index never built): left out of listings.
		return JobEntry{}, false, nil
	}
	if err != nil {
		return JobEntry{}, false, err
	}
	return JobEntry{ID: id, State: j.State, Desired: j.Desired, Created: j.CreatedAt, Updated: j.UpdatedAt, Revision: rev}, true, nil
}

func (s *Store) legacyEntries(ctx context.Context, ids []string) ([]JobEntry, error) {
	got := make([]JobEntry, len(ids))
	ok := make([]bool, len(ids))
	errs := make([]error, len(ids))
	sem := make(chan struct{}, stepReadConcurrency)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			got[i], ok[i], errs[i] = s.legacyEntry(ctx, id)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	out := make([]JobEntry, 0, len(ids))
	for i := range got {
		if ok[i] {
			out = append(out, got[i])
		}
	}
	return out, nil
}

func encodeCursor(e JobEntry) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(e.Created.UnixNano(), 10) + "." + e.ID))
}

func decodeCursor(c string) (JobEntry, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return JobEntry{}, fmt.Errorf("%w: %q", ErrBadCursor, c)
	}
	ns, id, ok := strings.Cut(string(b), ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || id == "" {
		return JobEntry{}, fmt.Errorf("%w: %q", ErrBadCursor, c)
	}
	return JobEntry{ID: id, Created: time.Unix(0, n)}, nil
}

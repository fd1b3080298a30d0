package jobstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// entry is one record read from the bucket's stream.
type entry struct {
	key  string
	rev  uint64
	data []byte
	// expiring says the record carries the retention TTL (Nats-TTL): a
	// step record of a job that ended (EndedStepWrite).
	expiring bool
}

const kvPrefix = "$KV." + protocol.BucketJobs + "."

// The subjects of the job records' keys (protocol.JobKey), all of them
// and less the id: what a listing's scan and the index follow.
var (
	jobKeysFilter = kvPrefix + protocol.JobKey("*")
	jobKeysPrefix = kvPrefix + protocol.JobKey("")
)

// directLast asks for the last message of key: a record, a removal
// marker, or a status (404: none).
func (s *Store) directLast(ctx context.Context, key string) (*nats.Msg, error) {
	return s.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+s.stream+"."+kvPrefix+key, nil)
}

// getLast reads the latest record of key with one direct get.
func (s *Store) getLast(ctx context.Context, key string) (entry, error) {
	m, err := s.directLast(ctx, key)
	if err != nil {
		return entry{}, fmt.Errorf("get %s: %w", key, err)
	}
	if st := m.Header.Get("Status"); st != "" {
		if st == "404" {
			return s.leaderLast(ctx, key)
		}
		return entry{}, fmt.Errorf("get %s: status %s %s", key, st, m.Header.Get("Description"))
	}
	e, ok, err := toEntry(m)
	if err != nil {
		return entry{}, fmt.Errorf("get %s: %w", key, err)
	}
	if !ok {
		return s.leaderLast(ctx, key)
	}
	return e, nil
}

// Removed reports whether a message of the bucket's stream says its key
// is gone: a KV delete or purge, or the server's marker for a record its
// TTL (a finished job's retention) or a purge removed, which carries
// Nats-Marker-Reason and none of Warden's headers (kept an hour).
func Removed(h nats.Header) bool {
	op := h.Get("KV-Operation")
	return op == "DEL" || op == "PURGE" || h.Get(jetstream.MarkerReasonHeader) != ""
}

// ErrBehindLeader says a read found nothing where the stream's leader has a
// record: a replica that has not stored it yet answered the direct get.
// It wraps ErrConflict, so that callers read again as after a lost CAS.
var ErrBehindLeader = fmt.Errorf("%w: read answered by a replica behind the stream leader", ErrConflict)

// missing is the error for a read of key that found no record: ErrNotFound
// once the stream's leader confirms it, else ErrBehindLeader. Direct gets are
// answered by any replica of a replicated bucket, and one may not have
// stored a record another process wrote a moment ago (make compose-test:
// a scheduler was told "no job" 24 ms after another created it, rejected
// the step's result, and the step waited for its lease). The leader's
// answer costs a request only on this path.
func (s *Store) missing(ctx context.Context, key string) error {
	if _, err := s.leaderLast(ctx, key); err != nil {
		return err
	}
	return fmt.Errorf("get %s: %w", key, ErrBehindLeader)
}

// leaderLast reads key's last record from the stream's leader: what a
// single-key read found missing at a replica behind it. The leader's
// answer carries the record, which is returned (ErrBehindLeader threw it
// away, and every caller read again, or failed: jobs ls, job cancel).
// ErrNotFound when the leader has none either, or only its removal.
func (s *Store) leaderLast(ctx context.Context, key string) (entry, error) {
	msg, err := leaderGet(ctx, s.nc, s.stream, struct {
		LastBySubj string `json:"last_by_subj"`
	}{kvPrefix + key})
	switch {
	case errors.Is(err, ErrNotFound):
		return entry{}, fmt.Errorf("get %s: %w", key, ErrNotFound)
	case err != nil:
		return entry{}, fmt.Errorf("get %s from the stream leader: %w", key, err)
	}
	var h nats.Header
	if len(msg.Header) > 0 {
		if h, err = nats.DecodeHeadersMsg(msg.Header); err != nil {
			return entry{}, fmt.Errorf("get %s from the stream leader: %w", key, err)
		}
		if Removed(h) {
			return entry{}, fmt.Errorf("get %s: %w", key, ErrNotFound)
		}
	}
	return entry{key: key, rev: msg.Seq, data: msg.Data, expiring: h.Get(headerTTL) != ""}, nil
}

// leaderMsg is what a STREAM.MSG.GET answers of a message.
type leaderMsg struct {
	Seq    uint64 `json:"seq"`
	Header []byte `json:"hdrs"`
	Data   []byte `json:"data"`
}

// leaderGet asks stream's leader (not a replica that may lag, as a direct
// get would) for the message req selects (the JetStream API's get
// request); ErrNotFound if there is none.
func leaderGet(ctx context.Context, nc *nats.Conn, stream string, req any) (leaderMsg, error) {
	b, _ := json.Marshal(req)
	m, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, b)
	if err != nil {
		return leaderMsg{}, err
	}
	var resp struct {
		Error *struct {
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *leaderMsg `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return leaderMsg{}, err
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == int(jetstream.JSErrCodeMessageNotFound):
		return leaderMsg{}, ErrNotFound
	case resp.Error != nil:
		return leaderMsg{}, errors.New(resp.Error.Description)
	case resp.Message == nil:
		return leaderMsg{}, errors.New("empty reply")
	}
	return *resp.Message, nil
}

// toEntry turns a direct-get reply into an entry; ok is false for a delete,
// purge or expiry marker.
func toEntry(m *nats.Msg) (entry, bool, error) {
	subj := m.Header.Get("Nats-Subject")
	seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
	if err != nil || !strings.HasPrefix(subj, kvPrefix) {
		return entry{}, false, fmt.Errorf("unexpected direct get reply (subject %q, sequence %q)", subj, m.Header.Get("Nats-Sequence"))
	}
	if Removed(m.Header) {
		return entry{}, false, nil
	}
	return entry{key: strings.TrimPrefix(subj, kvPrefix), rev: seq, data: m.Data, expiring: m.Header.Get(headerTTL) != ""}, true, nil
}

// maxBatchRecords is the most records one batched direct get returns
// (nats-server's maxAllowedResponses).
const maxBatchRecords = 1024

// pageBytes bounds one reply of a batched get. The server's own bound is
// its max_pending (64 MiB), the same as a client connection's outbound
// buffer: a reply that size made the server drop the connection's
// messages as a slow consumer, the end-of-batch marker with them, and the
// read waited for its deadline. A thousand ordinary records are about 1 MiB.
const pageBytes = 8 << 20

// errTooManyKeys: the filters match more keys than one batched direct get
// may return (the server answers 413).
var errTooManyKeys = errors.New("more keys than a batched get returns")

// multiLast reads the latest record of every key matching the filters
// (wildcards allowed) as of one point of the stream: the server's batched
// direct get (multi_last, nats-server ≥ 2.11). A reply ends after
// pageBytes (about 32 steps with 256 KiB outputs); the read goes on from
// the next sequence up to the same sequence, so it stays one point in time. More than 1,024 keys (a job of
// more steps, or compensation added to a large one) cannot be read that
// way at all; they are read with a consumer (lastByConsumer).
func (s *Store) multiLast(ctx context.Context, keys []string) (map[string]entry, error) {
	filters := make([]string, len(keys))
	for i, k := range keys {
		filters[i] = kvPrefix + k
	}
	out := make(map[string]entry)
	var from, upTo uint64
	for {
		more, last, up, err := s.multiLastPage(ctx, filters, from, upTo, out)
		if errors.Is(err, errTooManyKeys) {
			return s.lastByConsumer(ctx, filters)
		}
		if err != nil {
			return nil, fmt.Errorf("read %v: %w", keys, err)
		}
		if !more {
			return out, nil
		}
		from, upTo = last+1, up
	}
}

// multiLastPage asks for one reply of a batched get (from the stream
// sequence from up to upTo; zero: from the start, up to the last) and adds
// its records to out. more says the server stopped before the end; last
// and up are where to go on from and up to.
func (s *Store) multiLastPage(ctx context.Context, filters []string, from, upTo uint64, out map[string]entry) (more bool, last, up uint64, err error) {
	req, _ := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
		Seq       uint64   `json:"seq,omitempty"`
		UpToSeq   uint64   `json:"up_to_seq,omitempty"`
		MaxBytes  int      `json:"max_bytes"`
	}{filters, from, upTo, pageBytes})
	inbox := s.nc.NewRespInbox()
	// A channel sized for the largest batch (a message per record and the
	// end-of-batch marker): SubscribeSync would allocate its default
	// 65,536-slot channel (512 KiB) on every read, which made each cache
	// miss cost more garbage than the rest of a job's handling.
	replies := make(chan *nats.Msg, maxBatchRecords+2)
	sub, err := s.nc.ChanSubscribe(inbox, replies)
	if err != nil {
		return false, 0, 0, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := s.nc.PublishRequest("$JS.API.DIRECT.GET."+s.stream, inbox, req); err != nil {
		return false, 0, 0, err
	}
	got := 0
	for {
		var m *nats.Msg
		select {
		case m = <-replies:
		case <-ctx.Done():
			return false, 0, 0, ctx.Err()
		}
		switch st := m.Header.Get("Status"); st {
		case "":
		case "204": // end of batch
			np, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
			last, _ = strconv.ParseUint(m.Header.Get("Nats-Last-Sequence"), 10, 64)
			up, _ = strconv.ParseUint(m.Header.Get("Nats-UpTo-Sequence"), 10, 64)
			if np > 0 && (last == 0 || up == 0) {
				return false, 0, 0, fmt.Errorf("batch ended with %d pending and no position to go on from", np)
			}
			return np > 0, last, up, nil
		case "404":
			if got > 0 {
				// A record the server had resolved failed to load.
				return false, 0, 0, fmt.Errorf("batch cut short after %d records: %s %s", got, st, m.Header.Get("Description"))
			}
			return false, 0, 0, nil // no such key
		case "413":
			return false, 0, 0, errTooManyKeys
		default:
			return false, 0, 0, fmt.Errorf("status %s %s", st, m.Header.Get("Description"))
		}
		got++
		e, ok, err := toEntry(m)
		if err != nil {
			return false, 0, 0, err
		}
		if ok {
			out[e.key] = e
		}
	}
}

// lastByConsumer reads the latest record of every key matching the
// filters with an ordered consumer (the last message of each subject, then
// what is written meanwhile, until none is pending). Not one point of the
// stream as a batched get is: a record written during the read is read at
// its newest, which the revisions of later compare-and-set writes check.
func (s *Store) lastByConsumer(ctx context.Context, filters []string) (map[string]entry, error) {
	cons, err := s.js.OrderedConsumer(ctx, s.stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: filters, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
		InactiveThreshold: 30 * time.Second, // if the delete below is lost
	})
	if err != nil {
		return nil, fmt.Errorf("read %v: %w", filters, err)
	}
	// Every read of a wide job made one, and each stayed on the server
	// for nats.go's default threshold (5 minutes): a dashboard showing one
	// such job kept about 150 alive.
	defer streams.DropConsumer(ctx, s.js, s.stream, cons)
	out := make(map[string]entry)
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		return out, nil
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("read %v: %w", filters, err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return nil, fmt.Errorf("read %v: %w", filters, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, fmt.Errorf("read %v: %w", filters, err)
		}
		key := strings.TrimPrefix(m.Subject(), kvPrefix)
		if Removed(m.Headers()) {
			delete(out, key)
		} else {
			out[key] = entry{key: key, rev: md.Sequence.Stream, data: m.Data(), expiring: m.Headers().Get(headerTTL) != ""}
		}
		if md.NumPending == 0 {
			return out, nil
		}
	}
}

// behindRetry is Load's first wait before it reads again from a replica
// behind the leader; the wait doubles while it is at most behindRetryMax
// (about 300 ms in all), then ErrBehindLeader is returned.
const (
	behindRetry    = 10 * time.Millisecond
	behindRetryMax = 160 * time.Millisecond
)

// Snapshot is a job with all its steps, each with the revision of the
// record that holds it.
type Snapshot struct {
	Job    *Job
	JobRev uint64
	// Steps in spec order; a step not yet materialised is missing.
	Steps []*Step
	// Revs holds the revision of each step's record by step id (for an
	// inline job, the job record's revision).
	Revs map[string]uint64
	// Expiring holds the steps whose records carry the retention TTL (the
	// job ended, or is ending: EndedStepWrite).
	Expiring map[string]bool
}

// Load reads a job and all its steps in one batched get (the job record
// and every step record, as of one point of the stream: a consistent
// snapshot). A job whose steps live inline has no step records. A read
// a replica behind the stream's leader answered is made again after 10,
// 20 … 160 ms before ErrBehindLeader is returned (LoadOnce does not wait).
func (s *Store) Load(ctx context.Context, jobID string) (*Snapshot, error) {
	for wait := behindRetry; ; wait *= 2 {
		snap, err := s.LoadOnce(ctx, jobID)
		if !errors.Is(err, ErrBehindLeader) || wait > behindRetryMax {
			return snap, err
		}
		// The replica that answered lags the leader, by milliseconds
		// as a rule: its steps would be as stale as its job. Read again
		// rather than fail the caller (a listing, a cancel) at once.
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
	}
}

// LoadOnce is Load without its waits: ErrBehindLeader (a conflict) at
// once when a replica behind the stream's leader answered. For a caller
// that reads again on a conflict its own way (the scheduler puts the
// job's inputs back), which Load's waits would only hold up.
func (s *Store) LoadOnce(ctx context.Context, jobID string) (*Snapshot, error) {
	jobKey := protocol.JobKey(jobID)
	got, err := s.multiLast(ctx, []string{jobKey, protocol.StepKeysFilter(jobID)})
	if err != nil {
		return nil, err
	}
	je, ok := got[jobKey]
	if !ok {
		return nil, s.missing(ctx, jobKey)
	}
	delete(got, jobKey)
	j, err := jobOf(je)
	if err != nil {
		return nil, err
	}
	rev := je.rev
	snap := &Snapshot{Job: j, JobRev: rev, Revs: make(map[string]uint64, len(j.Spec.Steps))}
	if j.Inline {
		snap.Steps = j.Steps
		for _, st := range j.Steps {
			snap.Revs[st.ID] = rev
		}
		return snap, nil
	}
	order := make(map[string]int, len(j.Spec.Steps))
	for i, sp := range j.Spec.Steps {
		order[sp.ID] = i
	}
	for _, e := range got {
		st, rev, err := stepOf(e)
		if err != nil {
			return nil, err
		}
		snap.Steps = append(snap.Steps, st)
		snap.Revs[st.ID] = rev
		if e.expiring {
			if snap.Expiring == nil {
				snap.Expiring = map[string]bool{}
			}
			snap.Expiring[st.ID] = true
		}
	}
	sort.Slice(snap.Steps, func(a, b int) bool { return order[snap.Steps[a].ID] < order[snap.Steps[b].ID] })
	return snap, nil
}

// Versioned returns the steps with their revisions.
func (s *Snapshot) Versioned() []VersionedStep {
	out := make([]VersionedStep, len(s.Steps))
	for i, st := range s.Steps {
		out[i] = VersionedStep{Step: st, Revision: s.Revs[st.ID]}
	}
	return out
}

// stepReadConcurrency bounds the single-record reads one caller has in
// flight at once (listings read a page of jobs concurrently).
const stepReadConcurrency = 32

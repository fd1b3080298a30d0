package events

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

const (
	// readBatch is the most events one pull asks for.
	readBatch = 256
	// readWait bounds each pull (and the consumer bookkeeping) when ctx
	// has no earlier deadline: the events asked for are stored, so a
	// healthy server answers at once, and a server slower than this is
	// reported as an error rather than read as the end of the stream.
	readWait = 5 * time.Second
)

// MaxList is the most events List returns (limit 0 means as many).
const MaxList = 10000

// List reads the stored events of one kind, oldest first: the last limit
// of them (0: MaxList, also the most), as stored when it starts reading. It reads them with one
// pull consumer on the kind's subjects, started near the end of the stream
// so that only about limit events are fetched (a stream where the kind is
// rare takes a few tries to find where to start), and holds at most limit
// of them at a time. A read that cannot finish (the server stops
// answering, events are missed) is an error, never a shorter list.
// Messages that do not decode as events are skipped.
func List(ctx context.Context, js jetstream.JetStream, kind protocol.EventKind, limit int) ([]protocol.Event, error) {
	if limit <= 0 || limit > MaxList {
		// "All" read every event of the kind the stream keeps (1 GiB, 7
		// days) into memory, on every surface (API, CLI, micro).
		limit = MaxList
	}
	s, err := js.Stream(ctx, protocol.StreamEvents)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", protocol.StreamEvents, err)
	}
	state := s.CachedInfo().State
	if state.Msgs == 0 {
		return nil, nil
	}
	filter := protocol.EventSubject(kind, ">")
	first, last := state.FirstSeq, state.LastSeq
	// The window [start, last] is the first guess: the last limit messages
	// of the stream, all of this kind.
	start := first
	if last-first+1 > uint64(limit) {
		start = last - uint64(limit) + 1
	}
	for {
		cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{
			DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
			OptStartSeq:       start,
			FilterSubject:     filter,
			AckPolicy:         jetstream.AckNonePolicy,
			MemoryStorage:     true,
			Replicas:          1,
			InactiveThreshold: time.Minute, // if the delete below fails
		})
		if err != nil {
			return nil, fmt.Errorf("read %s events from %d: %w", kind, start, err)
		}
		// The events of this kind from start to the end of the stream.
		pending := cons.CachedInfo().NumPending
		if pending < uint64(limit) && start > first {
			// Too few in the window: widen it and try again.
			streams.DropConsumer(ctx, js, protocol.StreamEvents, cons)
			start = widen(first, last, start, pending, uint64(limit))
			continue
		}
		evs, err := read(ctx, cons, pending, limit)
		streams.DropConsumer(ctx, js, protocol.StreamEvents, cons)
		if err != nil {
			return nil, fmt.Errorf("read %s events from %d: %w", kind, start, err)
		}
		return evs, nil
	}
}

// widen returns the start of a window ending at last that should hold
// limit events of a kind, found times in the window [start, last]: at
// least twice as wide, wider as the kind is rarer, and never before first.
func widen(first, last, start, found, limit uint64) uint64 {
	span := last - start + 1
	grow := uint64(16) // not one in the window: look much further back
	if found > 0 {
		grow = max(2, 2*((limit+found-1)/found))
	}
	if span > (last-first+1)/grow {
		return first
	}
	return last - span*grow + 1
}

// read fetches the pending messages of cons (counted when it was created)
// and returns the events among them, the last limit. It stops
// early only when the server says nothing more is pending (messages
// removed meanwhile).
func read(ctx context.Context, cons jetstream.Consumer, pending uint64, limit int) ([]protocol.Event, error) {
	out := newTail(limit)
	var delivered uint64 // consumer sequence of the last message
	for delivered < pending {
		got, more, err := fetch(ctx, cons, min(pending-delivered, readBatch), &delivered, out)
		if err != nil {
			return nil, err
		}
		if !more {
			break
		}
		if got == 0 {
			// The pull ended without a message though some were pending
			// when the read began: removed since, or a slow server.
			ictx, cancel := context.WithTimeout(ctx, readWait)
			info, err := cons.Info(ictx)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("no events delivered at %d of %d; consumer info: %w", delivered, pending, err)
			}
			if info.NumPending == 0 {
				break
			}
			return nil, fmt.Errorf("no events delivered at %d of %d within %s, %d pending",
				delivered, pending, readWait, info.NumPending)
		}
	}
	return out.events(), nil
}

// fetch pulls up to n messages into out, checking that none was skipped
// (delivered is the consumer sequence of the last one). more is false
// when the server said nothing more is pending.
func fetch(ctx context.Context, cons jetstream.Consumer, n uint64, delivered *uint64, out *tail) (got int, more bool, err error) {
	fctx, cancel := context.WithTimeout(ctx, readWait)
	defer cancel()
	batch, err := cons.Fetch(int(n), jetstream.FetchContext(fctx))
	if err != nil {
		return 0, false, fmt.Errorf("fetch: %w", err)
	}
	more = true
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			return got, false, fmt.Errorf("event metadata: %w", err)
		}
		if md.Sequence.Consumer != *delivered+1 {
			// With AckNone nothing is redelivered: a message lost on the
			// way (a slow consumer, a reconnect) would be a hole in the list.
			return got, false, fmt.Errorf("events missed: delivery %d after %d", md.Sequence.Consumer, *delivered)
		}
		*delivered = md.Sequence.Consumer
		got++
		var e protocol.Event
		if json.Unmarshal(m.Data(), &e) == nil {
			out.add(e)
		}
		if md.NumPending == 0 {
			more = false
		}
	}
	if err := batch.Error(); err != nil {
		return got, false, fmt.Errorf("fetch: %w", err)
	}
	return got, more, nil
}

// tail keeps the last limit events added. Cut from the front, the
// slice's next growth copies only what it keeps: memory stays O(limit).
type tail struct {
	limit int
	buf   []protocol.Event
}

func newTail(limit int) *tail { return &tail{limit: limit} }

func (t *tail) add(e protocol.Event) {
	t.buf = append(t.buf, e)
	if len(t.buf) > t.limit {
		t.buf = t.buf[len(t.buf)-t.limit:]
	}
}

// events returns the events kept, oldest first.
func (t *tail) events() []protocol.Event { return t.buf }

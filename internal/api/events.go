package api

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/internal/watch"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// The event stream (GET /api/v1/events) is server-sent events of four
// types, merged from three sources:
//
//	event: job    data: {"id", "state", "desired", "created_at", "time"}   job store, job.<id> writes
//	event: step   data: {"job_id", "step_id", "state", "time"}             job store, step.<job>.<step> writes
//	event: agent  data: {"pool", "id", "change", "draining"}              presence: joined, left, drained, undrained
//	event: event  data: a protocol.Event                                   WARDEN_EVENTS (failover, healing, dead_lettered, ...)
//
// The job store is read headers-only, so a busy store costs the stream small
// messages and no decoding. ?types=job,agent keeps some types only. Each
// WARDEN_EVENTS event has the id "e<stream sequence>"; a client that
// reconnects with Last-Event-ID resumes the audit events after it (job,
// step and agent changes start from now: reload the views on reconnect).

// sseEvent is one message of the stream.
type sseEvent struct {
	ID   string
	Type string
	Data any
}

// streamTypes are the event types of the stream.
var streamTypes = []string{"job", "step", "agent", "event"}

// sseWriteTimeout bounds one write of the event stream: a client that
// stopped reading (but keeps its connection) is dropped then, with the
// consumers and watch its stream holds. A variable for tests.
var sseWriteTimeout = 30 * time.Second

// maxStreams bounds the event streams served at once: each holds up to
// three consumers and a presence watch on the server.
const maxStreams = 256

func (s *Server) events(w http.ResponseWriter, r *http.Request) error {
	if n := s.streams.Add(1); n > maxStreams {
		s.streams.Add(-1)
		return ops.Errorf(ops.CodeUnavailable, "%d event streams are open, the most this API serves: try again later", maxStreams)
	}
	defer s.streams.Add(-1)
	rc := http.NewResponseController(w)
	want := map[string]bool{}
	if v := r.URL.Query().Get("types"); v != "" {
		for _, t := range strings.Split(v, ",") {
			t = strings.TrimSpace(t)
			if !contains(streamTypes, t) {
				return ops.Errorf(ops.CodeInvalid, "types: %q is not one of %v", t, streamTypes)
			}
			want[t] = true
		}
	} else {
		for _, t := range streamTypes {
			want[t] = true
		}
	}
	after, err := lastEventID(r.Header.Get("Last-Event-ID"))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ch := make(chan sseEvent, 256)
	// Every feed is subscribed before the response starts, so that what
	// happens after the client sees the stream open is in it.
	var feeds []func() error
	if want["job"] || want["step"] {
		f, err := s.storeFeed(ctx, ch, want)
		if err != nil {
			return err
		}
		feeds = append(feeds, f)
	}
	if want["agent"] {
		f, err := s.agentFeed(ctx, ch)
		if err != nil {
			return err
		}
		feeds = append(feeds, f)
	}
	if want["event"] {
		f, err := s.auditFeed(ctx, ch, after)
		if err != nil {
			return err
		}
		feeds = append(feeds, f)
	}
	errc := make(chan error, len(feeds))
	for _, f := range feeds {
		go func() { errc <- f() }()
	}

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	// write sends one message within sseWriteTimeout; false: the client
	// is gone or stalled, and the stream ends (its feeds with it).
	write := func(format string, args ...any) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout))
		if _, err := fmt.Fprintf(w, format, args...); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	w.WriteHeader(http.StatusOK)
	if !write("retry: 2000\n: warden events %v\n\n", keys(want)) {
		return nil
	}
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			// A feed ended (NATS gone): end the response; the client
			// reconnects after retry.
			s.log.Warn().Err(err).Msg("event stream feed ended")
			return nil
		case <-keepalive.C:
			if !write(": keepalive\n\n") {
				return nil
			}
		case ev := <-ch:
			b, err := json.Marshal(ev.Data)
			if err != nil {
				continue
			}
			id := ""
			if ev.ID != "" {
				id = "id: " + ev.ID + "\n"
			}
			if !write("%sevent: %s\ndata: %s\n\n", id, ev.Type, b) {
				s.log.Info().Msg("event stream client stopped reading: stream ended")
				return nil
			}
		}
	}
}

// lastEventID reads a Last-Event-ID header: the stream sequence of the
// last audit event the client saw (e<sequence>); 0 for none. Ids of
// another shape are ignored (the stream gives them to no event); an
// e-id that is not a sequence the stream can resume after (not a number,
// or the largest one: the next would overflow to 0) is refused.
func lastEventID(v string) (uint64, error) {
	if !strings.HasPrefix(v, "e") {
		return 0, nil
	}
	after, err := strconv.ParseUint(v[1:], 10, 64)
	if err != nil || after == math.MaxUint64 {
		return 0, ops.Errorf(ops.CodeInvalid, "Last-Event-ID %q: want e<sequence> as the stream sent it", v)
	}
	return after, nil
}

func send(ctx context.Context, ch chan<- sseEvent, ev sseEvent) bool {
	select {
	case ch <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// storeFeed turns new job-store writes into job and step events, reading
// record headers only.
func (s *Server) storeFeed(ctx context.Context, ch chan<- sseEvent, want map[string]bool) (func() error, error) {
	js, err := jetstream.New(s.nc)
	if err != nil {
		return nil, err
	}
	stream := "KV_" + protocol.BucketJobs
	prefix := "$KV." + protocol.BucketJobs + "."
	var filters []string
	if want["job"] {
		filters = append(filters, prefix+"job.*")
	}
	if want["step"] {
		filters = append(filters, prefix+"step.>")
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: filters, DeliverPolicy: jetstream.DeliverNewPolicy, HeadersOnly: true,
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	return consume(ctx, js, stream, cons, func(m jetstream.Msg) bool {
		h := m.Headers()
		if jobstore.Removed(h) {
			// A delete, a purge, or the server's marker for a finished
			// job's record its retention removed: no state to show (the
			// marker read as a job event with an empty state).
			return true
		}
		md, _ := m.Metadata()
		t := time.Now().UTC()
		if md != nil {
			t = md.Timestamp.UTC()
		}
		key := strings.TrimPrefix(m.Subject(), prefix)
		parts := strings.Split(key, ".")
		state := h.Get(protocol.HeaderRecordState)
		switch {
		case len(parts) == 2 && parts[0] == "job":
			return send(ctx, ch, sseEvent{Type: "job", Data: map[string]any{
				"id": parts[1], "state": state, "desired": h.Get(protocol.HeaderRecordDesired),
				"created_at": h.Get(protocol.HeaderRecordCreated), "time": t,
			}})
		case len(parts) == 3 && parts[0] == "step":
			return send(ctx, ch, sseEvent{Type: "step", Data: map[string]any{
				"job_id": parts[1], "step_id": parts[2], "state": state, "time": t,
			}})
		}
		return true
	})
}

// auditFeed forwards WARDEN_EVENTS, new ones or those after sequence after.
func (s *Server) auditFeed(ctx context.Context, ch chan<- sseEvent, after uint64) (func() error, error) {
	js, err := jetstream.New(s.nc)
	if err != nil {
		return nil, err
	}
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy, InactiveThreshold: 30 * time.Second}
	if after > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	cons, err := js.OrderedConsumer(ctx, protocol.StreamEvents, cfg)
	if err != nil {
		return nil, err
	}
	return consume(ctx, js, protocol.StreamEvents, cons, func(m jetstream.Msg) bool {
		var e protocol.Event
		if json.Unmarshal(m.Data(), &e) != nil {
			return true
		}
		id := ""
		if md, err := m.Metadata(); err == nil {
			id = "e" + strconv.FormatUint(md.Sequence.Stream, 10)
		}
		return send(ctx, ch, sseEvent{ID: id, Type: "event", Data: e})
	})
}

// agentFeed reports agents joining, leaving and changing drain state (not
// every heartbeat). It follows the presence bucket with internal/watch:
// after a gap the bucket is read again and only the differences are
// reported, an agent that left meanwhile included.
func (s *Server) agentFeed(ctx context.Context, ch chan<- sseEvent) (func() error, error) {
	js, err := jetstream.New(s.nc)
	if err != nil {
		return nil, err
	}
	w, err := watch.New(ctx, js, protocol.BucketPresence, watch.Config{Logger: s.log})
	if err != nil {
		return nil, err
	}
	// The agents present now (the first read) are the baseline; changes
	// after it are sent.
	draining := map[string]bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx, func(e watch.Event) {
			if e.Initial {
				var p protocol.Presence
				if json.Unmarshal(e.Entry.Value(), &p) == nil {
					draining[e.Key] = p.Draining
				}
				return
			}
			if ev, ok := agentChange(draining, e); ok {
				send(ctx, ch, sseEvent{Type: "agent", Data: ev})
			}
		})
	}()
	select {
	case <-w.Ready():
	case <-ctx.Done():
		<-done
		return nil, ctx.Err()
	}
	return func() error {
		<-done // Run returns only when the request ends
		return nil
	}, nil
}

// agentChange updates draining from a presence change and says what
// changed for the stream, if anything.
func agentChange(draining map[string]bool, e watch.Event) (map[string]any, bool) {
	pool, id, _ := strings.Cut(e.Key, ".")
	ev := map[string]any{"pool": pool, "id": id, "draining": false}
	if e.Gone() {
		if _, ok := draining[e.Key]; !ok {
			return nil, false
		}
		delete(draining, e.Key)
		ev["change"] = "left"
		return ev, true
	}
	var p protocol.Presence
	if json.Unmarshal(e.Entry.Value(), &p) != nil {
		return nil, false
	}
	was, known := draining[e.Key]
	draining[e.Key] = p.Draining
	ev["draining"] = p.Draining
	switch {
	case !known:
		ev["change"] = "joined"
	case was != p.Draining && p.Draining:
		ev["change"] = "drained"
	case was != p.Draining:
		ev["change"] = "undrained"
	default:
		return nil, false
	}
	return ev, true
}

// consume starts pulling from cons (of stream) now and returns the loop
// that hands messages to f until ctx ends or f returns false.
func consume(ctx context.Context, js jetstream.JetStream, stream string, cons jetstream.Consumer, f func(jetstream.Msg) bool) (func() error, error) {
	it, err := cons.Messages()
	if err != nil {
		return nil, err
	}
	// Stops the iterator and deletes the consumer when the request ends,
	// whether or not the loop ever runs. Left, each stream's two
	// consumers stayed on the server for their inactive threshold, and a
	// client reconnecting (the dashboard does on every view change) piled
	// them up past the cap on streams.
	context.AfterFunc(ctx, func() {
		it.Stop()
		streams.DropConsumer(ctx, js, stream, cons)
	})
	return func() error {
		for {
			m, err := it.Next()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			if !f(m) {
				return nil
			}
		}
	}, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func keys(m map[string]bool) []string {
	var out []string
	for _, t := range streamTypes {
		if m[t] {
			out = append(out, t)
		}
	}
	return out
}

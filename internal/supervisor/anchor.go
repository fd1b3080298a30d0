package supervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// anchorBody says what an anchor is to whoever reads it with `nats stream view`.
var anchorBody = []byte("Warden anchor: keeps this work-queue stream's last file block from emptying on every ack; no consumer takes it (docs/protocol.md, \"Anchors\").")

// anchors keeps one message, the anchor, on each work-queue stream's
// protocol.AnchorSubject, and keeps it in the stream's last file block.
//
// Why: nats-server (2.10-2.15 at least) replaces a file stream's last block
// when an ack removes its last message: it creates a new block file, writes
// a tombstone and deletes the old file. A work-queue stream that is idle
// between jobs empties on nearly every ack, so at low and moderate load each
// job paid that three times (submission, task, result). In the bench, at
// 10 % of the maximum rate, it was 40 % of nats-server's CPU, and low-load
// submit→complete p50 fell from 1.8 to 1.2 ms without it (docs/performance.md,
// "Session 9"). An unacked message in the last block keeps it from emptying.
//
// How: every interval, for each stream, if anything was stored after the
// anchor (the stream's last sequence moved past it), store a new anchor and
// delete the previous one, so the anchor follows the last block as blocks
// fill and rotate. An idle stream costs one STREAM.INFO per interval and no
// write. A term's first anchor on a stream is followed by a search (by
// subject) for anchors earlier terms left, which it deletes; while two
// supervisors both think they lead, each keeps its own and the next term
// removes the spare. A sequence is deleted only after a get shows it still
// holds an anchor: a stream deleted and created again (or restored) while a
// term runs reuses sequences.
type anchors struct {
	js      jetstream.JetStream
	streams []string
	every   time.Duration
	log     zerolog.Logger
	state   map[string]*anchorState
}

// anchorState is what this term knows of one stream's anchors.
type anchorState struct {
	created time.Time // the stream's creation: another means it was made again
	last    uint64    // the anchor this term stored last; 0: none yet
	swept   bool      // no anchor before last but those in stale
	stale   []uint64  // this term's earlier anchors not deleted yet
}

// maxStale bounds the anchors a term remembers to delete; past it the
// oldest are forgotten and left to a sweep by subject.
const maxStale = 64

func newAnchors(js jetstream.JetStream, names []string, every time.Duration, log zerolog.Logger) *anchors {
	return &anchors{js: js, streams: names, every: every, log: log, state: make(map[string]*anchorState, len(names))}
}

func (a *anchors) run(ctx context.Context) error {
	t := time.NewTicker(a.every)
	defer t.Stop()
	failing := map[string]bool{}
	for {
		for _, name := range a.streams {
			err := a.keep(ctx, name)
			switch {
			case ctx.Err() != nil:
				return nil
			case err != nil && !failing[name]:
				// An anchor is an optimisation: a failure costs speed, never
				// a job. Said once per streak, not every interval.
				a.log.Warn().Err(err).Str("stream", name).Msg("anchor not kept; retrying every interval")
				failing[name] = true
			case err == nil && failing[name]:
				a.log.Info().Str("stream", name).Msg("anchor kept again")
				delete(failing, name)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// keep makes the anchor of stream name its newest message unless nothing
// was stored since the anchor this term wrote, and deletes older anchors.
func (a *anchors) keep(ctx context.Context, name string) error {
	s, err := a.js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	st := a.state[name]
	info := s.CachedInfo()
	lastSeq := info.State.LastSeq
	if st == nil || lastSeq < st.last || !info.Created.Equal(st.created) {
		// First look in this term, or the stream was made again (deleted
		// and created, restored): start over.
		st = &anchorState{created: info.Created}
		a.state[name] = st
	}
	subject := protocol.AnchorSubject(name)
	if st.last == 0 || lastSeq != st.last {
		ack, err := a.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: anchorBody}, jetstream.WithExpectStream(name))
		if err != nil {
			// The server may have stored it all the same (a lost PubAck):
			// sweep by subject once a publish succeeds.
			st.swept = false
			return fmt.Errorf("store anchor of %s: %w", name, err)
		}
		if st.last != 0 {
			st.stale = append(st.stale, st.last)
			if n := len(st.stale) - maxStale; n > 0 {
				st.stale = st.stale[n:]
				st.swept = false
			}
		}
		st.last = ack.Sequence
	}
	if !st.swept {
		if err := a.removeBefore(ctx, s, subject, st.last); err != nil {
			return err
		}
		st.swept = true
	}
	for len(st.stale) > 0 {
		if err := a.remove(ctx, s, subject, st.stale[0]); err != nil {
			return err
		}
		st.stale = st.stale[1:]
	}
	return nil
}

// removeBefore deletes every message on subject stored before seq. It finds
// them one at a time (the server's next message on a subject, from its
// per-subject index): there are as many as terms that ended between an
// anchor's store and the delete of the one before, usually none. A purge of
// the subject would do it in one request, but the permission to purge is
// the permission to empty the whole stream.
func (a *anchors) removeBefore(ctx context.Context, s jetstream.Stream, subject string, seq uint64) error {
	for from := uint64(1); from < seq; {
		m, err := s.GetMsg(ctx, from, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("find earlier anchors on %s: %w", subject, err)
		}
		if m.Sequence >= seq {
			return nil
		}
		if err := streams.DeleteMsg(ctx, s, m.Sequence); err != nil {
			return err
		}
		from = m.Sequence + 1
	}
	return nil
}

// remove deletes this term's earlier anchor seq if seq still holds one.
func (a *anchors) remove(ctx context.Context, s jetstream.Stream, subject string, seq uint64) error {
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read anchor %d on %s: %w", seq, subject, err)
	}
	if m.Subject != subject {
		return nil // not ours: the sequence was reused
	}
	return streams.DeleteMsg(ctx, s, seq)
}

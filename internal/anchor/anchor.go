// Package anchor keeps one unconsumed message, the anchor, as the newest
// message of each of Warden's work-queue streams (docs/protocol.md,
// "Anchors"). The supervisor leader runs a Keeper as one of its duties; the
// bench's job-shaped pipeline runs one too, so that it carries Warden's
// protocol as it is.
package anchor

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

// body says what an anchor is to whoever reads it with `nats stream view`.
var body = []byte("Warden anchor: keeps this work-queue stream's last file block from emptying on every ack; no consumer takes it (docs/protocol.md, \"Anchors\").")

// Keeper keeps one message, the anchor, on each work-queue stream's
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
// anchor (the stream's last sequence moved past it), store a new anchor,
// then delete every anchor before it, found by subject from where the last
// such sweep ended: so the anchor follows the last block as blocks fill and
// rotate, and only messages on the anchor subject are ever deleted. An idle
// stream costs one STREAM.INFO per interval and no write. A new keeper (the
// supervisor makes one per term of leadership) starts its sweeps at
// sequence 1, which removes what earlier keepers left; while two
// supervisors both think they lead, each sweeps the other's away and stores
// its own. A sweep that fails, or an anchor stored whose PubAck was lost,
// is picked up by the next sweep, which starts no later.
type Keeper struct {
	js      jetstream.JetStream
	streams []string
	every   time.Duration
	log     zerolog.Logger
	state   map[string]*state
}

// state is what this keeper knows of one stream's anchors.
type state struct {
	created time.Time // the stream's creation: another means it was made again
	last    uint64    // the anchor this keeper stored last; 0: none yet
	from    uint64    // no anchor before it but last's: where the next sweep starts
}

// New returns a keeper of the anchors of the streams names (streams.Anchored),
// moving them every interval.
func New(js jetstream.JetStream, names []string, every time.Duration, log zerolog.Logger) *Keeper {
	return &Keeper{js: js, streams: names, every: every, log: log, state: make(map[string]*state, len(names))}
}

// Run keeps the anchors every interval until ctx ends; a stream whose anchor
// cannot be kept is logged once per streak of failures and tried again.
func (a *Keeper) Run(ctx context.Context) error {
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
// was stored since the anchor this keeper wrote, and deletes older anchors.
func (a *Keeper) keep(ctx context.Context, name string) error {
	s, err := a.js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	info := s.CachedInfo()
	st := a.state[name]
	if st == nil || !info.Created.Equal(st.created) || info.State.LastSeq < st.last {
		// First look by this keeper, or the stream was made again (deleted
		// and created, restored): sweep it from the start.
		st = &state{created: info.Created, from: 1}
		a.state[name] = st
	}
	subject := protocol.AnchorSubject(name)
	if st.last == 0 || info.State.LastSeq != st.last {
		ack, err := a.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: body}, jetstream.WithExpectStream(name))
		if err != nil {
			return fmt.Errorf("store anchor of %s: %w", name, err)
		}
		st.last = ack.Sequence
	}
	return a.sweep(ctx, s, subject, st)
}

// sweep deletes every message on subject from st.from up to st.last,
// finding them one at a time (the server's next message on a subject, from
// its per-subject index): usually one, the anchor before. A purge of the
// subject would do it in one request, but the permission to purge is the
// permission to empty the whole stream.
func (a *Keeper) sweep(ctx context.Context, s jetstream.Stream, subject string, st *state) error {
	for st.from < st.last {
		m, err := s.GetMsg(ctx, st.from, jetstream.WithGetMsgSubject(subject))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			st.from = st.last // not even last: a later sweep finds what is stored after it
			return nil
		case err != nil:
			return fmt.Errorf("find earlier anchors on %s: %w", subject, err)
		case m.Sequence >= st.last:
			st.from = st.last
			return nil
		}
		if err := streams.DeleteMsg(ctx, s, m.Sequence); err != nil {
			return err
		}
		st.from = m.Sequence + 1
	}
	return nil
}

package anchor

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// lastBlock is the index of the newest message block file of a stream in
// the server's store (<store>/jetstream/$G/streams/<name>/msgs/<index>.blk).
func lastBlock(t *testing.T, dir, stream string) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "jetstream", "$G", "streams", stream, "msgs", "*.blk"))
	if err != nil {
		t.Fatal(err)
	}
	last := -1
	for _, f := range files {
		if n, err := strconv.Atoi(strings.TrimSuffix(filepath.Base(f), ".blk")); err == nil && n > last {
			last = n
		}
	}
	if last < 0 {
		t.Fatalf("no block files of %s under %s", stream, dir)
	}
	return last
}

// oneAtATime stores n tasks on one agent's subject and takes and acks each
// before the next is stored, as an idle agent does.
func oneAtATime(t *testing.T, js jetstream.JetStream, cons jetstream.Consumer, subject string, n int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i++ {
		if _, err := js.Publish(ctx, subject, []byte("task")); err != nil {
			t.Fatal(err)
		}
		b, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range b.Messages() {
			if m.Subject() != subject {
				t.Fatalf("the agent's consumer was given %s", m.Subject())
			}
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
			got++
		}
		if got != 1 {
			t.Fatalf("fetched %d tasks, want 1 (%v)", got, b.Error())
		}
	}
}

// TestAnchorsKeepTheLastBlock shows the server behaviour anchors exist for,
// and that they stop it: without an anchor, every ack that empties a
// work-queue stream makes nats-server write a new block file; with one, the
// stream keeps its block.
func TestAnchorsKeepTheLastBlock(t *testing.T) {
	srv, _, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	stream := protocol.TaskStream(0)
	subject := protocol.TaskSubject(0, "pool", "agent")
	cons, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "agent", FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20

	before := lastBlock(t, srv.Dir, stream)
	oneAtATime(t, js, cons, subject, n)
	without := lastBlock(t, srv.Dir, stream) - before
	if without < n/2 {
		// nats-server no longer replaces the block: anchors may have lost
		// their reason (docs/protocol.md, "Anchors").
		t.Fatalf("without an anchor %d tasks made %d new block files; expected about one each", n, without)
	}

	a := New(js, []string{stream}, 10*time.Millisecond, zerolog.Nop())
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	natstest.Eventually(t, 5*time.Second, "anchor stored", func() bool {
		count, _ := anchorsOn(t, js, stream)
		return count == 1
	})
	before = lastBlock(t, srv.Dir, stream)
	oneAtATime(t, js, cons, subject, n)
	with := lastBlock(t, srv.Dir, stream) - before
	if with != 0 {
		t.Fatalf("with an anchor %d tasks made %d new block files (without: %d)", n, with, without)
	}
	t.Logf("%d tasks taken one at a time: %d new block files without an anchor, %d with", n, without, with)
}

// anchorsOn returns how many anchors stream holds and the newest one's
// sequence.
func anchorsOn(t *testing.T, js jetstream.JetStream, stream string) (count, newest uint64) {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(protocol.AnchorSubject(stream)))
	if err != nil {
		t.Fatal(err)
	}
	count = info.State.Subjects[protocol.AnchorSubject(stream)]
	if count > 0 {
		m, err := s.GetLastMsgForSubject(ctx, protocol.AnchorSubject(stream))
		if err != nil {
			t.Fatal(err)
		}
		newest = m.Sequence
	}
	return count, newest
}

// TestAnchorsMoveOnlyAfterWrites: an idle stream is not written to; a
// stored message moves the anchor past it, leaving one; a new term removes
// the anchors earlier terms left.
func TestAnchorsMoveOnlyAfterWrites(t *testing.T) {
	_, _, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	stream := protocol.StreamSubmit
	lastSeq := func() uint64 {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State.LastSeq
	}
	// Anchors an earlier term left, among submissions.
	for i := 0; i < 3; i++ {
		if _, err := js.Publish(ctx, protocol.AnchorSubject(stream), body); err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: protocol.SubmitSubject("job-" + strconv.Itoa(i)), Data: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}

	a := New(js, []string{stream}, time.Hour, zerolog.Nop())
	if err := a.keep(ctx, stream); err != nil {
		t.Fatal(err)
	}
	count, newest := anchorsOn(t, js, stream)
	if count != 1 || newest != lastSeq() {
		t.Fatalf("after a term's first keep: %d anchors, newest %d, stream's last %d; want 1, the last", count, newest, lastSeq())
	}
	info, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if msgs := info.CachedInfo().State.Msgs; msgs != 4 {
		t.Fatalf("%d messages in %s, want the 3 submissions and 1 anchor", msgs, stream)
	}

	idle := lastSeq()
	for i := 0; i < 3; i++ {
		if err := a.keep(ctx, stream); err != nil {
			t.Fatal(err)
		}
	}
	if got := lastSeq(); got != idle {
		t.Fatalf("idle stream written to: last sequence %d → %d", idle, got)
	}

	if _, err := js.Publish(ctx, protocol.SubmitSubject("job-late"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := a.keep(ctx, stream); err != nil {
		t.Fatal(err)
	}
	count, moved := anchorsOn(t, js, stream)
	if count != 1 || moved != lastSeq() || moved <= newest {
		t.Fatalf("after a submission: %d anchors, newest %d (was %d), stream's last %d; want 1, moved to the last", count, moved, newest, lastSeq())
	}
}

// TestAnchorsNeverDeleteAReusedSequence: a stream deleted and created again
// while a term runs reuses sequences; the anchor this term stored at one of
// them is gone, and the message there now is not deleted: anchors are
// found by subject, never deleted by a remembered sequence.
func TestAnchorsNeverDeleteAReusedSequence(t *testing.T) {
	srv, _, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	stream := protocol.StreamSubmit
	submit := func(n int) {
		for i := 0; i < n; i++ {
			if _, err := js.Publish(ctx, protocol.SubmitSubject("job-"+strconv.Itoa(i)), []byte("{}")); err != nil {
				t.Fatal(err)
			}
		}
	}
	a := New(js, []string{stream}, time.Hour, zerolog.Nop())
	submit(2)
	if err := a.keep(ctx, stream); err != nil {
		t.Fatal(err)
	}
	if _, anchor := anchorsOn(t, js, stream); anchor != 3 {
		t.Fatalf("anchor at %d, want 3", anchor)
	}

	if err := js.DeleteStream(ctx, stream); err != nil {
		t.Fatal(err)
	}
	srv.Ensure(t, js, streams.Options{})
	submit(5) // sequences 1-5: 3 is a submission now
	if err := a.keep(ctx, stream); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.GetMsg(ctx, 3); err != nil || m.Subject == protocol.AnchorSubject(stream) {
		t.Fatalf("sequence 3 after the stream was made again: %v (%v); want the submission there", m, err)
	}
	count, anchor := anchorsOn(t, js, stream)
	if msgs := s.CachedInfo().State.Msgs; count != 1 || anchor != 6 || msgs != 6 {
		t.Fatalf("%d anchors, newest %d, %d messages; want 1 anchor at 6 beside the 5 submissions", count, anchor, msgs)
	}
}

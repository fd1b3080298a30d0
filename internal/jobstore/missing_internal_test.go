package jobstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// TestMissingAsksTheStreamLeader: a read that found no record is
// ErrNotFound only if the stream's leader has none either (or only its
// removal); if the leader has the record, the read was answered by a
// replica behind it, and the error is ErrBehindLeader, a conflict, so
// that the caller reads again. On one server the direct get and the
// leader agree, so the replica's miss is played by calling missing for a
// key that is there.
func TestMissingAsksTheStreamLeader(t *testing.T) {
	t.Parallel()
	ctx, s, _ := openStore(t, 10*time.Second)
	kv := s.KV()
	present, gone := protocol.JobKey("present"), protocol.JobKey("gone")
	for _, k := range []string{present, gone} {
		if _, err := kv.Put(ctx, k, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.Delete(ctx, gone); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		key  string
		want error
	}{
		{protocol.JobKey("never"), ErrNotFound},
		{gone, ErrNotFound},
		{present, ErrBehindLeader},
	}
	for _, c := range cases {
		if err := s.missing(ctx, c.key); !errors.Is(err, c.want) {
			t.Errorf("missing(%s) = %v, want %v", c.key, err, c.want)
		}
	}
	if err := s.missing(ctx, present); !errors.Is(err, ErrConflict) {
		t.Errorf("ErrBehindLeader is not a conflict: %v", err)
	}
	// Through the reads: a key that is absent everywhere is ErrNotFound.
	if _, err := s.Load(ctx, "never"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Load of a job that does not exist: %v", err)
	}
	if _, _, err := s.Step(ctx, "never", "s"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Step of a job that does not exist: %v", err)
	}
}

// A single-key read that a replica behind the leader answered "no
// record" is answered from the leader, record and all: the leader's answer
// carried it, and ErrBehindLeader threw it away. On one server the
// replica's miss is played by asking the leader for a key that is there.
//
// Old code: no leaderLast (missing returned ErrBehindLeader without the
// record).
func TestLeaderLastReturnsTheLeadersRecord(t *testing.T) {
	t.Parallel()
	ctx, s, _ := openStore(t, 10*time.Second)
	key := protocol.StepKey("j", "a")
	rev, err := s.KV().Put(ctx, key, []byte(`{"id":"a","state":"running"}`))
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.leaderLast(ctx, key)
	if err != nil || e.rev != rev || string(e.data) != `{"id":"a","state":"running"}` || e.key != key {
		t.Fatalf("leaderLast = %+v, %v; want the record at revision %d", e, err, rev)
	}
	st, got, err := stepOf(e)
	if err != nil || st.ID != "a" || got != rev {
		t.Fatalf("stepOf = %+v, %d, %v", st, got, err)
	}
	if err := s.KV().Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := s.leaderLast(ctx, key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("leaderLast of a deleted key: %v, want ErrNotFound", err)
	}
}

// openStore opens a job store on a server of its own; ctx ends after d,
// or with the test.
func openStore(t *testing.T, d time.Duration) (context.Context, *Store, jetstream.JetStream) {
	t.Helper()
	_, _, js := natstest.Start(t, streams.Options{TaskShards: 1})
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	s, err := Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, s, js
}

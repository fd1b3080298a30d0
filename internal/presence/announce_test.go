package presence_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

const (
	testTTL      = time.Second
	testInterval = 200 * time.Millisecond
)

func setupKV(t *testing.T) jetstream.KeyValue {
	t.Helper()
	_, _, js := natstest.Start(t, streams.Options{PresenceTTL: testTTL, TaskShards: 1})
	kv, err := js.KeyValue(context.Background(), protocol.BucketPresence)
	if err != nil {
		t.Fatalf("presence bucket: %v", err)
	}
	return kv
}

func newAnnouncer(t *testing.T, kv jetstream.KeyValue, host string, pid int, value func() protocol.Presence) *presence.Announcer {
	t.Helper()
	started := time.Now().UTC()
	if value == nil {
		value = func() protocol.Presence {
			return protocol.Presence{ID: "a1", Pool: "p", Host: host, PID: pid, StartedAt: started}
		}
	}
	a, err := presence.NewAnnouncer(kv, presence.AnnouncerConfig{Pool: "p", ID: "a1", Interval: testInterval, Presence: value})
	if err != nil {
		t.Fatalf("new announcer: %v", err)
	}
	return a
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func getPresence(t *testing.T, kv jetstream.KeyValue) (protocol.Presence, uint64, error) {
	t.Helper()
	e, err := kv.Get(context.Background(), protocol.PresenceKey("p", "a1"))
	if err != nil {
		return protocol.Presence{}, 0, err
	}
	var p protocol.Presence
	if err := json.Unmarshal(e.Value(), &p); err != nil {
		t.Fatalf("decode presence: %v", err)
	}
	return p, e.Revision(), nil
}

func TestAnnounceHeartbeatStop(t *testing.T) {
	t.Parallel()
	kv := setupKV(t)
	ctx := ctxT(t)
	a := newAnnouncer(t, kv, "h1", 1, nil)
	if err := a.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	p, rev0, err := getPresence(t, kv)
	if err != nil || p.Host != "h1" || p.HeartbeatAt.IsZero() {
		t.Fatalf("announced value: %+v, %v", p, err)
	}
	// Heartbeats outlive the TTL: the key is still there after 2 TTLs, rewritten.
	natstest.Eventually(t, 5*time.Second, "heartbeats past the TTL", func() bool {
		_, rev, err := getPresence(t, kv)
		return err == nil && rev > rev0+uint64(2*testTTL/testInterval)
	})
	if err := a.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if _, _, err := getPresence(t, kv); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("after stop: want ErrKeyNotFound, got %v", err)
	}
	if a.Err() != nil {
		t.Fatalf("Err after Stop: %v", a.Err())
	}
}

func TestDuplicateRefused(t *testing.T) {
	t.Parallel()
	kv := setupKV(t)
	ctx := ctxT(t)
	first := newAnnouncer(t, kv, "host-one", 111, nil)
	if err := first.Start(ctx); err != nil {
		t.Fatalf("start first: %v", err)
	}
	defer func() { _ = first.Stop(ctx) }()

	second := newAnnouncer(t, kv, "host-two", 222, nil)
	err := second.Start(ctx)
	var dup *presence.DuplicateError
	if !errors.As(err, &dup) {
		t.Fatalf("want *DuplicateError, got %v", err)
	}
	if dup.Other.Host != "host-one" || dup.Other.PID != 111 || dup.TakenOver {
		t.Fatalf("duplicate names the wrong agent: %+v", dup)
	}
	// The first one is unharmed.
	if p, _, err := getPresence(t, kv); err != nil || p.Host != "host-one" {
		t.Fatalf("first agent's key: %+v, %v", p, err)
	}
	if first.Err() != nil {
		t.Fatalf("first announcer stopped: %v", first.Err())
	}
}

func TestCrashedKeyRetaken(t *testing.T) {
	t.Parallel()
	kv := setupKV(t)
	ctx := ctxT(t)
	crashed := newAnnouncer(t, kv, "host-one", 111, nil)
	crashCtx, crash := context.WithCancel(ctx)
	if err := crashed.Start(crashCtx); err != nil {
		t.Fatalf("start: %v", err)
	}
	crash() // heartbeats stop, the key stays: a crashed process
	<-crashed.Done()
	// The crash left the key: only its expiry can let the restart in.
	// (How long the restart waits is bounded by Start itself, which gives
	// up with ErrStaleKey after TTL + 1 s; the test does not time it.)
	old, oldRev, err := getPresence(t, kv)
	if err != nil || old.PID != 111 {
		t.Fatalf("key after the crash: %+v, %v; want the crashed run's", old, err)
	}

	restarted := newAnnouncer(t, kv, "host-one", 333, nil)
	if err := restarted.Start(ctx); err != nil {
		t.Fatalf("restart after crash: %v", err)
	}
	if p, rev, err := getPresence(t, kv); err != nil || p.PID != 333 || rev <= oldRev {
		t.Fatalf("key after restart: %+v at revision %d (crashed run's %d), %v", p, rev, oldRev, err)
	}
	_ = restarted.Stop(ctx)
}

func TestReannounceAfterExpiry(t *testing.T) {
	t.Parallel()
	kv := setupKV(t)
	ctx := ctxT(t)
	started := time.Now().UTC()
	pause := make(chan struct{})
	paused := make(chan struct{}, 1)
	beats := 0
	value := func() protocol.Presence {
		beats++
		if beats == 3 { // the first heartbeat after announcing: simulate a long GC pause / SIGSTOP
			paused <- struct{}{}
			<-pause
		}
		return protocol.Presence{ID: "a1", Pool: "p", Host: "h", PID: 1, StartedAt: started}
	}
	a := newAnnouncer(t, kv, "", 0, value)
	if err := a.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	<-paused
	natstest.Eventually(t, 5*time.Second, "key expires while paused", func() bool {
		_, _, err := getPresence(t, kv)
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
	close(pause)
	natstest.Eventually(t, 5*time.Second, "key re-announced after the pause", func() bool {
		p, _, err := getPresence(t, kv)
		return err == nil && p.Host == "h"
	})
	if a.Err() != nil {
		t.Fatalf("announcer stopped: %v", a.Err())
	}
	_ = a.Stop(ctx)
}

func TestTakenOverStopsHeartbeat(t *testing.T) {
	t.Parallel()
	kv := setupKV(t)
	ctx := ctxT(t)
	a := newAnnouncer(t, kv, "host-one", 111, nil)
	if err := a.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	intruder, _ := json.Marshal(protocol.Presence{ID: "a1", Pool: "p", Host: "host-two", PID: 222})
	if _, err := kv.Put(ctx, protocol.PresenceKey("p", "a1"), intruder); err != nil {
		t.Fatalf("put: %v", err)
	}
	select {
	case <-a.Done():
	case <-ctx.Done():
		t.Fatal("heartbeat loop did not stop after the key was taken over")
	}
	var dup *presence.DuplicateError
	if !errors.As(a.Err(), &dup) || !dup.TakenOver || dup.Other.Host != "host-two" {
		t.Fatalf("want taken-over DuplicateError naming host-two, got %v", a.Err())
	}
	// Stop must not delete the intruder's key.
	_ = a.Stop(ctx)
	if p, _, err := getPresence(t, kv); err != nil || p.Host != "host-two" {
		t.Fatalf("intruder's key deleted: %+v, %v", p, err)
	}
}

// TestAnnouncerFillsIntervalAndUtilisation: the Announcer adds what every
// agent's heartbeat must carry for health: its interval and, from the
// second heartbeat on, a sampled utilisation in [0, 1]; a value the agent
// sets itself is kept.
func TestAnnouncerFillsIntervalAndUtilisation(t *testing.T) {
	t.Parallel()
	kv := setupKV(t)
	ctx := ctxT(t)
	a := newAnnouncer(t, kv, "h1", 1, nil)
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Stop(ctx) }()
	natstest.Eventually(t, 5*time.Second, "a heartbeat with interval and utilisation", func() bool {
		p, _, err := getPresence(t, kv)
		return err == nil && p.HeartbeatInterval.Std() == testInterval && p.Utilisation != nil &&
			*p.Utilisation >= 0 && *p.Utilisation <= 1
	})
	// Sampled utilisation is in whole percent, so that an idle agent's
	// record does not change between heartbeats.
	if p, _, err := getPresence(t, kv); err != nil || math.Abs(*p.Utilisation*100-math.Round(*p.Utilisation*100)) > 1e-9 {
		t.Fatalf("utilisation not in whole percent: %+v, %v", p.Utilisation, err)
	}

	kv2 := setupKV(t)
	own := 0.7
	b, err := presence.NewAnnouncer(kv2, presence.AnnouncerConfig{Pool: "p", ID: "a1", Interval: testInterval,
		Presence: func() protocol.Presence {
			return protocol.Presence{ID: "a1", Pool: "p", Host: "h", PID: 2, Utilisation: &own,
				HeartbeatInterval: protocol.Duration(time.Minute)}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Stop(ctx) }()
	p, _, err := getPresence(t, kv2)
	if err != nil || p.Utilisation == nil || *p.Utilisation != 0.7 || p.HeartbeatInterval.Std() != time.Minute {
		t.Fatalf("agent's own values replaced: %+v, %v", p, err)
	}
}

// A second process reads the key (direct gets, no watch), so a put and a
// delete between two of its reads look like a key that is gone, and it
// takes the key. Whichever way the race goes, one process keeps the key:
// the second one is refused, or the first one's next heartbeat finds the
// second's value and stops it.
func TestDeletedWhileObservedOneHolderRemains(t *testing.T) {
	t.Parallel()
	kv := setupKV(t)
	ctx := ctxT(t)
	first := newAnnouncer(t, kv, "host-one", 111, nil)
	if err := first.Start(ctx); err != nil {
		t.Fatalf("start first: %v", err)
	}
	defer func() { _ = first.Stop(ctx) }()
	second := newAnnouncer(t, kv, "host-two", 222, nil)
	started := make(chan error, 1)
	go func() { started <- second.Start(ctx) }()
	// The first process's key vanishes (an operator's delete) while the
	// second observes it.
	if err := kv.Delete(ctx, protocol.PresenceKey("p", "a1")); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-started:
	case <-ctx.Done():
		t.Fatal("second Start did not return")
	}
	var dup *presence.DuplicateError
	switch {
	case err == nil:
		defer func() { _ = second.Stop(ctx) }()
		select {
		case <-first.Done():
		case <-ctx.Done():
			t.Fatal("both processes hold the key: the first did not stop")
		}
		if !errors.As(first.Err(), &dup) || !dup.TakenOver || dup.Other.Host != "host-two" {
			t.Fatalf("first stopped with %v, want taken over by host-two", first.Err())
		}
		if p, _, err := getPresence(t, kv); err != nil || p.Host != "host-two" {
			t.Fatalf("key: %+v, %v", p, err)
		}
	case errors.As(err, &dup):
		// The first re-created its key first; it keeps it.
		natstest.Eventually(t, 5*time.Second, "the first process's key back", func() bool {
			p, _, err := getPresence(t, kv)
			return err == nil && p.Host == "host-one"
		})
		if first.Err() != nil {
			t.Fatalf("first stopped: %v", first.Err())
		}
	default:
		t.Fatalf("second Start: %v", err)
	}
}

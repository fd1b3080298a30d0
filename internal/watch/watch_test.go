package watch_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/watch"
)

const bucket = "watched"

// natsServer is a test server stopped and started again on the same port
// with the same store, as a nats-server restart (natstest.Server.Down, Up).
type natsServer struct{ *natstest.Server }

func startServer(t *testing.T) *natsServer { return &natsServer{natstest.New(t)} }

// connect connects as Warden's processes do (natsconn): reconnect forever.
func (s *natsServer) connect(t *testing.T, wait time.Duration) (*nats.Conn, jetstream.JetStream) {
	return s.ConnectReconnecting(t, wait)
}

// view is what a handler built from the events.
type view struct {
	mu     sync.Mutex
	values map[string]string
	events []watch.Event
}

func (v *view) handle(e watch.Event) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.events = append(v.events, e)
	if e.Gone() {
		delete(v.values, e.Key)
		return
	}
	v.values[e.Key] = string(e.Entry.Value())
}

func (v *view) get(k string) (string, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	s, ok := v.values[k]
	return s, ok
}

func (v *view) find(match func(watch.Event) bool) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, e := range v.events {
		if match(e) {
			return true
		}
	}
	return false
}

// createBucket connects to srv and creates the bucket (entries living ttl,
// 0 for ever).
func createBucket(t *testing.T, srv *natsServer, ttl time.Duration) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	_, js := srv.connect(t, 250*time.Millisecond)
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: bucket, History: 1, TTL: ttl,
		Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	return js, kv
}

// bucketStream returns the bucket's stream.
func bucketStream(t *testing.T, js jetstream.JetStream) jetstream.Stream {
	t.Helper()
	stream, err := js.Stream(context.Background(), "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

// run runs w with handle until the test ends.
func run(t *testing.T, w *watch.Watch, handle func(watch.Event)) {
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(rctx, handle) }()
	t.Cleanup(func() { cancel(); <-done })
}

// runReady runs w with handle until the test ends and waits for its first
// read.
func runReady(t *testing.T, w *watch.Watch, handle func(watch.Event)) {
	t.Helper()
	run(t, w, handle)
	select {
	case <-w.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("watch not ready")
	}
}

// stall deletes the consumers of the bucket's stream (the watcher's) and
// puts "while-stalled" at key.
func stall(t *testing.T, stream jetstream.Stream, kv jetstream.KeyValue, key string) {
	t.Helper()
	ctx := context.Background()
	for info := range stream.ListConsumers(ctx).Info() {
		if err := stream.DeleteConsumer(ctx, info.Name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.PutString(ctx, key, "while-stalled"); err != nil {
		t.Fatal(err)
	}
}

type setup struct {
	srv *natsServer
	nc  *nats.Conn // the watch's connection
	w   *watch.Watch
	v   *view
	kv  jetstream.KeyValue // another connection's handle on the bucket
	js  jetstream.JetStream
}

// newSetup creates the bucket with keys, then starts a watch on its own
// connection (reconnect wait as given).
func newSetup(t *testing.T, reconnectWait time.Duration, keys map[string]string) *setup {
	t.Helper()
	srv := startServer(t)
	ctx := context.Background()
	js, kv := createBucket(t, srv, 0)
	for k, v := range keys {
		if _, err := kv.PutString(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	nc, wjs := srv.connect(t, reconnectWait)
	w, err := watch.New(ctx, wjs, bucket, watch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	v := &view{values: map[string]string{}}
	runReady(t, w, v.handle)
	return &setup{srv: srv, nc: nc, w: w, v: v, kv: kv, js: js}
}

// reopen gives the test a handle on the bucket after the server restarted
// (its old connection reconnects too, but need not have yet).
func (s *setup) reopen(t *testing.T) jetstream.KeyValue {
	t.Helper()
	_, js := s.srv.connect(t, 250*time.Millisecond)
	var kv jetstream.KeyValue
	natstest.Eventually(t, 10*time.Second, "bucket available after restart", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var err error
		kv, err = js.KeyValue(ctx, bucket)
		return err == nil
	})
	s.js = js
	return kv
}

func TestWatchReportsChanges(t *testing.T) {
	t.Parallel()
	s := newSetup(t, 250*time.Millisecond, map[string]string{"a": "1", "b": "2"})
	ctx := context.Background()
	if !s.v.find(func(e watch.Event) bool { return e.Key == "a" && e.Initial && !e.Gone() }) {
		t.Fatal("initial a not reported as Initial")
	}
	if st := s.w.Status(); !st.Fresh || !st.GapEnded.IsZero() || !s.w.Settled(time.Hour, time.Now()) {
		t.Fatalf("status after start: %+v", st)
	}
	if _, err := s.kv.PutString(ctx, "c", "3"); err != nil {
		t.Fatal(err)
	}
	if err := s.kv.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "put c and delete a seen", func() bool {
		_, hasA := s.v.get("a")
		c, _ := s.v.get("c")
		return !hasA && c == "3"
	})
	if !s.v.find(func(e watch.Event) bool { return e.Key == "a" && e.Op == jetstream.KeyValueDelete && !e.Resync }) {
		t.Fatal("delete of a not reported as a delete")
	}
}

// TestWatchResyncsAfterServerRestart: nats-server restarts (same store,
// same port) under a watch, after a 2 s outage. The watch says it is stale while the server
// is away and is fresh again, with a change made after the restart in its
// view, within about a second of the restart (a plain KV watch stays
// silent 8–10 s). A supervisor-style caller sees Settled false until its
// wait after the gap has passed.
func TestWatchResyncsAfterServerRestart(t *testing.T) {
	t.Parallel()
	s := newSetup(t, 250*time.Millisecond, map[string]string{"a": "1", "b": "2"})
	s.srv.Down()
	natstest.Eventually(t, 5*time.Second, "gap noticed while the server is down", func() bool { return !s.w.Fresh() })
	if s.w.Settled(0, time.Now()) {
		t.Fatal("settled while the server is down")
	}
	time.Sleep(2 * time.Second) // an outage of a few seconds: the watch keeps trying meanwhile
	s.srv.Up(t)
	restarted := time.Now()
	kv := s.reopen(t)
	if _, err := kv.PutString(context.Background(), "b", "after-restart"); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "fresh again with the change made after the restart", func() bool {
		b, _ := s.v.get("b")
		return s.w.Fresh() && b == "after-restart"
	})
	took := time.Since(restarted)
	st := s.w.Status()
	t.Logf("view fresh and current %s after the server restarted (status %+v)", took.Round(time.Millisecond), st)
	if st.Resyncs < 1 || !st.GapEnded.After(st.GapStarted) {
		t.Fatalf("status after restart: %+v", st)
	}
	if s.w.Settled(time.Hour, time.Now()) || !s.w.Settled(0, time.Now()) {
		t.Fatal("Settled does not count from the end of the gap")
	}
}

// TestWatchNoticesKeyRemovedDuringGap: while the watch's connection is
// away the server restarts and a key is purged without leaving any marker
// (as an expiry whose marker aged out, or a bucket without markers): no
// watcher can ever deliver that. The re-sync after the reconnect finds the
// key missing and reports it gone (Resync), and the other key's change.
func TestWatchNoticesKeyRemovedDuringGap(t *testing.T) {
	t.Parallel()
	// A long reconnect wait keeps the watch away until the test is ready.
	s := newSetup(t, time.Hour, map[string]string{"keep": "1", "gone": "2"})
	s.srv.Down()
	natstest.Eventually(t, 5*time.Second, "gap noticed", func() bool { return !s.w.Fresh() })
	s.srv.Up(t)
	kv := s.reopen(t)
	ctx := context.Background()
	stream := bucketStream(t, s.js)
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject("$KV."+bucket+".gone")); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(ctx, "keep", "changed"); err != nil {
		t.Fatal(err)
	}
	if s.w.Fresh() {
		t.Fatal("fresh before its connection came back")
	}
	if err := s.nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "re-synced: gone removed, keep changed", func() bool {
		_, hasGone := s.v.get("gone")
		keep, _ := s.v.get("keep")
		return s.w.Fresh() && !hasGone && keep == "changed"
	})
	if !s.v.find(func(e watch.Event) bool { return e.Key == "gone" && e.Resync && e.Op == jetstream.KeyValuePurge }) {
		t.Fatal("gone not reported as removed by the re-sync")
	}
	if !s.v.find(func(e watch.Event) bool { return e.Key == "keep" && e.Resync && !e.Gone() }) {
		t.Fatal("keep's change not reported by the re-sync")
	}
}

// TestWatchDetectsStalledWatcher: the watcher's consumer disappears on the
// server (as when the node holding it dies in a cluster) while the
// connection stays up. nats.go would notice after two missed 5 s
// heartbeats; the watch's own heartbeat probe sees the bucket move on
// without it and re-syncs.
func TestWatchDetectsStalledWatcher(t *testing.T) {
	t.Parallel()
	s := newSetup(t, 250*time.Millisecond, map[string]string{"a": "1"})
	ctx := context.Background()
	stream := bucketStream(t, s.js)
	var names []string
	for name := range stream.ListConsumers(ctx).Info() {
		names = append(names, name.Name)
	}
	for _, n := range names {
		if err := stream.DeleteConsumer(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if _, err := s.kv.PutString(ctx, "a", "while-stalled"); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "change seen after the watcher's consumer vanished", func() bool {
		a, _ := s.v.get("a")
		return a == "while-stalled" && s.w.Fresh()
	})
	t.Logf("%d consumer(s) deleted; change seen after %s (resyncs %d)", len(names), time.Since(start).Round(time.Millisecond), s.w.Status().Resyncs)
	if s.w.Status().Resyncs < 1 {
		t.Fatal("no re-sync recorded")
	}
}

// TestWatchFilteredKeys: a watch restricted to some keys reports only
// those, calls Synced after its first read, is not fooled into a re-sync by
// the rest of the bucket moving on (its probe looks at its own keys), and
// still notices a stalled watcher on them.
func TestWatchFilteredKeys(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	ctx := context.Background()
	js, kv := createBucket(t, srv, 0)
	for _, k := range []string{"a.1", "a.2", "b.1"} {
		if _, err := kv.PutString(ctx, k, "v"); err != nil {
			t.Fatal(err)
		}
	}
	const beat = 100 * time.Millisecond
	synced := make(chan bool, 8)
	w := watch.ForKV(js, kv, watch.Config{Keys: []string{"a.>"}, Heartbeat: beat, Synced: func(resync bool) { synced <- resync }})
	v := &view{values: map[string]string{}}
	run(t, w, v.handle)
	select {
	case resync := <-synced:
		if resync {
			t.Fatal("first Synced says resync")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("never synced")
	}
	if _, ok := v.get("a.1"); !ok {
		t.Fatal("a.1 not reported before Synced")
	}
	if _, ok := v.get("b.1"); ok {
		t.Fatal("b.1 reported by a watch of a.>")
	}
	// The rest of the bucket moves on: for 20 heartbeats the watch must
	// neither report it nor take it for a stalled watcher.
	for i := range 20 {
		if _, err := kv.PutString(ctx, "b.1", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(beat)
	}
	if st := w.Status(); st.Resyncs != 0 || !st.Fresh {
		t.Fatalf("other keys' writes caused a re-sync: %+v", st)
	}
	if _, ok := v.get("b.1"); ok {
		t.Fatal("b.1 reported")
	}
	// Its own keys: a stalled watcher is still noticed.
	stall(t, bucketStream(t, js), kv, "a.2")
	natstest.Eventually(t, 5*time.Second, "a.2's change seen after a re-sync", func() bool {
		a, _ := v.get("a.2")
		return a == "while-stalled" && w.Status().Resyncs >= 1
	})
	select {
	case resync := <-synced:
		if !resync {
			t.Fatal("Synced after the re-sync says first read")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Synced not called after the re-sync")
	}
}

// TestWatchNoResyncLoopAfterNewestMessageExpired: the bucket's newest
// message is gone before the watch starts (an entry whose TTL expired
// without a marker, as a health record does; likewise a limit marker that
// aged out, or PurgeDeletes). The stream's last sequence still names it, but
// no watcher can deliver it: the watch must not take that for a stalled
// watcher at every quiet heartbeat (re-sync after re-sync, a consumer
// created each time, the gap never ending so Settled stays false).
func TestWatchNoResyncLoopAfterNewestMessageExpired(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	ctx := context.Background()
	js, kv := createBucket(t, srv, time.Second)
	if _, err := kv.PutString(ctx, "a", "1"); err != nil {
		t.Fatal(err)
	}
	stream := bucketStream(t, js)
	natstest.Eventually(t, 10*time.Second, "a expired", func() bool {
		info, err := stream.Info(ctx)
		return err == nil && info.State.Msgs == 0 && info.State.LastSeq == 1
	})
	w := watch.ForKV(js, kv, watch.Config{})
	v := &view{values: map[string]string{}}
	runReady(t, w, v.handle)
	// Four quiet heartbeats: each would have been a re-sync. Showing that
	// something does not happen takes a bounded wait.
	time.Sleep(4 * time.Second)
	if st := w.Status(); st.Resyncs != 0 || !st.Fresh || !w.Settled(time.Hour, time.Now()) {
		t.Fatalf("re-synced over a message that expired before the watch started: %+v", st)
	}
	// It still notices a stalled watcher: its consumer vanishes and the
	// bucket moves on.
	stall(t, stream, kv, "b")
	// b itself may expire before the re-sync reads it (TTL 1 s): the
	// re-sync is what shows the stall was noticed.
	natstest.Eventually(t, 5*time.Second, "re-sync after the watcher's consumer vanished", func() bool {
		return w.Status().Resyncs >= 1
	})
}

// startWatch runs a watch of bucket on its own connection with cfg and
// handle, and waits for its first read.
func startWatch(t *testing.T, srv *natsServer, cfg watch.Config, handle func(watch.Event)) *watch.Watch {
	t.Helper()
	_, js := srv.connect(t, 250*time.Millisecond)
	w, err := watch.New(context.Background(), js, bucket, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runReady(t, w, handle)
	return w
}

// TestWatchProbeToleratesInFlightDelivery: a handler busy for longer than
// a heartbeat while the next put is stored. When it returns, the quiet
// heartbeat's probe and that put's delivery are both waiting; a probe that
// runs first finds the bucket one beyond what was delivered, though the
// watcher is not stalled. The watch must wait for the delivery rather than
// re-sync. Each round is such a race (the order of the two is up to
// select), so a watch that re-syncs on one behind probe does so within a
// few rounds.
func TestWatchProbeToleratesInFlightDelivery(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	ctx := context.Background()
	_, kv := createBucket(t, srv, 0)
	const beat = 100 * time.Millisecond
	v := &view{values: map[string]string{}}
	w := startWatch(t, srv, watch.Config{Heartbeat: beat}, func(e watch.Event) {
		if e.Key == "slow" && !e.Initial {
			time.Sleep(2 * beat) // a slow handler: the ticker fires meanwhile
		}
		v.handle(e)
	})
	for i := range 12 {
		if _, err := kv.PutString(ctx, "slow", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
		if _, err := kv.PutString(ctx, "next", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 5*time.Second, fmt.Sprintf("round %d delivered", i), func() bool {
			n, _ := v.get("next")
			return n == fmt.Sprint(i)
		})
		if st := w.Status(); st.Resyncs != 0 {
			t.Fatalf("round %d: re-synced over a delivery in flight: %+v", i, st)
		}
	}
	// A round's probe may still be waiting for the next heartbeat's verdict.
	time.Sleep(3 * beat)
	if st := w.Status(); st.Resyncs != 0 || !st.Fresh {
		t.Fatalf("re-synced over a delivery in flight: %+v", st)
	}
}

// TestWatchSteadyWriterNoResync: one writer puts a key about once a
// heartbeat, with jitter, as an agent's presence heartbeat does. Now and
// then a quiet heartbeat's probe lands between a put being stored and its
// delivery; that is no stall and must not cost a re-sync.
func TestWatchSteadyWriterNoResync(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	ctx := context.Background()
	_, kv := createBucket(t, srv, 0)
	const beat = 50 * time.Millisecond
	v := &view{values: map[string]string{}}
	w := startWatch(t, srv, watch.Config{Heartbeat: beat}, v.handle)
	for i := range 100 {
		if _, err := kv.PutString(ctx, "k", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
		// The writer's own period: one heartbeat, give or take a tenth,
		// so the puts sweep across the watch's ticks.
		time.Sleep(beat + time.Duration(i%11-5)*beat/50)
	}
	natstest.Eventually(t, 5*time.Second, "last put seen", func() bool {
		k, _ := v.get("k")
		return k == "99"
	})
	if st := w.Status(); st.Resyncs != 0 || !st.Fresh {
		t.Fatalf("steady writer caused re-syncs: %+v", st)
	}
}

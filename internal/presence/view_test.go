package presence_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/internal/selection"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// restartable is a test server restarted on the same port with the same
// store (natstest.Server.Down and Up).
type restartable struct{ *natstest.Server }

func startRestartable(t *testing.T) *restartable { return &restartable{natstest.New(t)} }

// connect as Warden's processes do (natsconn): reconnect forever, 250ms apart.
func (r *restartable) connect(t *testing.T) jetstream.JetStream {
	_, js := r.ConnectReconnecting(t, 250*time.Millisecond)
	return js
}

// TestViewResyncsAfterServerRestart: agents a (heartbeating) and b (its
// process frozen: no heartbeat, key not deleted) are in a view that feeds
// a selector. nats-server restarts after an outage longer than the
// presence TTL. The view goes stale at once, re-syncs within about a
// second of the restart (not the 8–10 s of a plain KV watch), reports b
// gone (its key expired during the outage), has a back (its announcer
// re-announces), and the selector follows: pinned steps find a and not b.
// Settled stays false for a TTL after the gap.
func TestViewResyncsAfterServerRestart(t *testing.T) {
	t.Parallel()
	srv := startRestartable(t)
	js := srv.connect(t)
	natstest.Eventually(t, 10*time.Second, "streams", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return streams.Ensure(ctx, js, streams.Options{PresenceTTL: testTTL, TaskShards: 1}) == nil
	})
	ctx := ctxT(t)
	kv, err := js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	announce := func(id string) (*presence.Announcer, context.CancelFunc) {
		started := time.Now().UTC()
		a, err := presence.NewAnnouncer(kv, presence.AnnouncerConfig{Pool: "p", ID: id, Interval: testInterval,
			Presence: func() protocol.Presence {
				return protocol.Presence{ID: id, Pool: "p", Actions: []string{"echo"}, MaxConcurrent: 4, Host: "h", PID: 1,
					StartedAt: started, TaskStream: protocol.TaskStream(0), TaskSubject: protocol.TaskSubject(0, "p", id)}
			}})
		if err != nil {
			t.Fatal(err)
		}
		actx, cancel := context.WithCancel(ctx)
		if err := a.Start(actx); err != nil {
			t.Fatal(err)
		}
		return a, cancel
	}
	_, stopA := announce("a")
	defer stopA()
	_, freezeB := announce("b")

	view, err := presence.NewView(ctx, srv.connect(t), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	sel := selection.New()
	view.Feed(sel)
	var mu sync.Mutex
	var changes []presence.Change
	view.OnChange(func(c presence.Change) { mu.Lock(); changes = append(changes, c); mu.Unlock() })
	vctx, vcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = view.Run(vctx) }()
	defer func() { vcancel(); <-done }()
	<-view.Ready()
	pinned := func(id string) error {
		_, err := sel.Peek(selection.Request{Pool: "p", Action: "echo", Agent: id})
		return err
	}
	natstest.Eventually(t, 5*time.Second, "a and b selectable", func() bool { return pinned("a") == nil && pinned("b") == nil })

	freezeB() // b's process stops heartbeating without deleting its key
	srv.Down()
	natstest.Eventually(t, 5*time.Second, "view stale while the server is down", func() bool { return !view.Fresh() })
	time.Sleep(testTTL + 500*time.Millisecond) // an outage longer than the presence TTL
	srv.Up(t)
	restarted := time.Now()
	natstest.Eventually(t, 10*time.Second, "view fresh again", view.Fresh)
	resynced := time.Since(restarted)
	natstest.Eventually(t, 10*time.Second, "b gone and a present", func() bool {
		ids := map[string]bool{}
		for _, p := range view.Pool("p") {
			ids[p.ID] = true
		}
		return ids["a"] && !ids["b"] && pinned("a") == nil && pinned("b") != nil
	})
	t.Logf("view re-synced %s after the restart; b gone and a back %s after it; status %+v",
		resynced.Round(time.Millisecond), time.Since(restarted).Round(time.Millisecond), view.Status())
	mu.Lock()
	var bGone bool
	for _, c := range changes {
		if c.Key == "p.b" && c.Gone && c.Presence.ID == "b" {
			bGone = true
		}
	}
	mu.Unlock()
	if !bGone {
		t.Fatal("b's departure was not reported")
	}
	if view.LastGapEnd().IsZero() || view.Settled(time.Hour, time.Now()) {
		t.Fatalf("gap end %v; settled for an hour after a gap just now", view.LastGapEnd())
	}
}

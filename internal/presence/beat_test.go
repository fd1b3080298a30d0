package presence_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/internal/selection"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// TestViewLivenessRefreshes: an agent whose record does not change between
// heartbeats is seen by the view as liveness refreshes (Change.Beat, the
// previous record with the new heartbeat_at, its sinks still fed); a
// change of in_flight or draining is decoded in full and seen at its next
// heartbeat; a record written by another encoder is decoded in full.
func TestViewLivenessRefreshes(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.Start(t, streams.Options{PresenceTTL: testTTL, TaskShards: 1})
	ctx := ctxT(t)
	kv, err := js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	var inFlight atomic.Int64
	var draining atomic.Bool
	started := time.Now().UTC()
	own := 0.25
	a, err := presence.NewAnnouncer(kv, presence.AnnouncerConfig{Pool: "p", ID: "a1", Interval: testInterval,
		Presence: func() protocol.Presence {
			return protocol.Presence{ID: "a1", Pool: "p", Actions: []string{"echo"}, MaxConcurrent: 4, Host: "h", PID: 1,
				StartedAt: started, TaskStream: protocol.TaskStream(0), TaskSubject: protocol.TaskSubject(0, "p", "a1"),
				InFlight: int(inFlight.Load()), Draining: draining.Load(), Utilisation: &own}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Stop(context.Background()) }()

	view, err := presence.NewView(ctx, js, zerolog.Nop(), presence.WithTaskShards(1))
	if err != nil {
		t.Fatal(err)
	}
	fed := &countingSink{}
	view.Feed(fed)
	sel := selection.New()
	view.Feed(sel)
	var mu sync.Mutex
	var changes []presence.Change
	view.OnChange(func(c presence.Change) {
		mu.Lock()
		changes = append(changes, c)
		mu.Unlock()
	})
	vctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = view.Run(vctx) }()
	<-view.Ready()

	// since returns the changes seen from index i on.
	since := func(i int) []presence.Change {
		mu.Lock()
		defer mu.Unlock()
		return append([]presence.Change(nil), changes[min(i, len(changes)):]...)
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(changes) }

	natstest.Eventually(t, 5*time.Second, "three liveness refreshes, heartbeat_at rising", func() bool {
		var beats []presence.Change
		for _, c := range since(0) {
			if c.Beat {
				beats = append(beats, c)
			}
		}
		if len(beats) < 3 {
			return false
		}
		for i := 1; i < len(beats); i++ {
			if !beats[i].Presence.HeartbeatAt.After(beats[i-1].Presence.HeartbeatAt) {
				t.Fatalf("refresh %d: heartbeat_at %s not after %s", i, beats[i].Presence.HeartbeatAt, beats[i-1].Presence.HeartbeatAt)
			}
		}
		b := beats[len(beats)-1].Presence
		if b.ID != "a1" || b.MaxConcurrent != 4 || b.Utilisation == nil || *b.Utilisation != own || len(b.Actions) != 1 {
			t.Fatalf("refresh carries %+v, not the agent's record", b)
		}
		got := view.Pool("p")
		return len(got) == 1 && got[0].HeartbeatAt.Equal(b.HeartbeatAt)
	})
	if got, ok := view.Get(protocol.PresenceKey("p", "a1")); !ok || got.ID != "a1" || got.HeartbeatAt.IsZero() {
		t.Fatalf("Get a1: %+v, %v", got, ok)
	}
	if _, ok := view.Get(protocol.PresenceKey("p", "nobody")); ok {
		t.Fatal("Get found an agent that never announced")
	}
	if fed.observed.Load() < 4 {
		t.Fatalf("sinks observed %d records, want every refresh", fed.observed.Load())
	}

	// A material change is decoded in full.
	mark := count()
	inFlight.Store(3)
	natstest.Eventually(t, 5*time.Second, "in_flight 3 decoded", func() bool {
		for _, c := range since(mark) {
			if !c.Beat && c.Presence.InFlight == 3 {
				return true
			}
		}
		return false
	})
	mark = count()
	draining.Store(true)
	natstest.Eventually(t, 5*time.Second, "draining seen and the agent out of selection", func() bool {
		for _, c := range since(mark) {
			if !c.Beat && c.Presence.Draining {
				_, err := sel.Choose(selection.Request{Pool: "p", Action: "echo"})
				return err != nil
			}
		}
		return false
	})

	// Another writer's encoding (spaces) is decoded in full every time.
	b := []byte(`{"id": "b1", "pool": "p", "max_concurrent": 2, "task_stream": "WARDEN_TASKS_0", "task_subject": "warden.task.0.p.b1", "heartbeat_at": "2026-11-26T08:00:00Z"}`)
	mark = count()
	for range 2 {
		if _, err := kv.Put(ctx, protocol.PresenceKey("p", "b1"), b); err != nil {
			t.Fatal(err)
		}
	}
	natstest.Eventually(t, 5*time.Second, "b1 decoded twice", func() bool {
		n := 0
		for _, c := range since(mark) {
			if c.Key == "p.b1" {
				if c.Beat || c.Presence.MaxConcurrent != 2 {
					t.Fatalf("b1 change %+v", c)
				}
				n++
			}
		}
		return n == 2
	})
}

type countingSink struct{ observed, forgotten atomic.Int64 }

func (s *countingSink) Observe(protocol.Presence) { s.observed.Add(1) }
func (s *countingSink) Forget(protocol.Presence)  { s.forgotten.Add(1) }

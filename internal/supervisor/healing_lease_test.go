package supervisor

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// A failover whose orders the lease refused (errNotLeader while a renewal
// was late, the term going on afterwards) was remembered as done: the
// agent's queue was never moved, however long it stayed failed.
//
// Old code: "the failed agent's task was never moved: step dispatched on a1".
func TestFailoverRefusedByTheLeaseIsTriedAgain(t *testing.T) {
	t.Parallel()
	p := newParts(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	view, err := presence.NewView(ctx, p.js, zerolog.Nop(), presence.WithTaskShards(streams.DefaultTaskShards))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = view.Run(ctx) }()
	pkv, err := p.js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	hkv, err := p.js.KeyValue(ctx, protocol.BucketHealth)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := health.NewTracker(health.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-view.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("presence view not ready")
	}
	// a1 says it is as unwell as can be: failed, on its own word, not for
	// being silent.
	beat := func(at time.Time) {
		pr := protocol.Presence{ID: "a1", Pool: "default", MaxConcurrent: 4, Health: health.Known(0), Utilisation: health.Known(1),
			StartedAt: at.Add(-time.Minute), HeartbeatAt: at}.Routed(streams.DefaultTaskShards)
		b, _ := json.Marshal(pr)
		if _, err := pkv.Put(ctx, protocol.PresenceKey("default", "a1"), b); err != nil {
			t.Fatal(err)
		}
		tr.Heartbeat(pr, at)
	}
	beat(time.Now())
	for deadline := time.Now().Add(10 * time.Second); len(view.Agents()) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a1 not in the view")
		}
	}
	p.dispatched(t, "job-f", "a1")
	p.consume(t, "a1", 5, 1)

	as := &assessor{term: p.term, tracker: tr, kv: hkv, view: view, sight: newSight(p.nc, view, time.Millisecond, time.Now),
		log: zerolog.Nop(), written: map[string]written{}}
	h := &healer{term: p.term, assessor: as, ops: ops.New(p.nc, p.store), failover: p.fo, selfHealing: true,
		drainTimeout: time.Minute, cycle: 100 * time.Millisecond, log: testLog(t), care: map[string]*agentCare{}}
	if a, ok := tr.Assess(protocol.PresenceKey("default", "a1"), time.Now()); !ok || a.Level != health.Failed {
		t.Fatalf("a1 assessed %+v, want failed", a)
	}

	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if clear, _ := as.sight.clear(time.Now()); clear {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sight never clear")
		}
	}

	// The lease is refused for one cycle (its renewal late), then back.
	p.lease.epoch.Store(0)
	h.heal(ctx, time.Now())
	p.lease.epoch.Store(7)
	for i := range 3 {
		now := time.Now().Add(time.Duration(i+1) * 4 * time.Second) // gaps that keep it failed
		beat(now)
		h.heal(ctx, now)
	}
	st, _, err := p.store.Step(ctx, "job-f", "s")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != jobstore.StepPending {
		t.Fatalf("the failed agent's task was never moved: step %s on %s", st.State, st.Actor)
	}
	if c := h.care[protocol.PresenceKey("default", "a1")]; c == nil || c.action != ActionFailover {
		t.Fatalf("care %+v, want the failover in force", c)
	}
}

func testLog(t *testing.T) zerolog.Logger {
	if !testing.Verbose() {
		return zerolog.Nop()
	}
	return zerolog.New(zerolog.NewTestWriter(t))
}

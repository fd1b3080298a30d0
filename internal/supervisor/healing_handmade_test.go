package supervisor_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// handmade is an agent made by hand: a presence record the test keeps
// fresh and a control responder the test scripts, with no runtime behind
// them. It is for what a real agent will not do on request: answer an
// order with an error, never answer, or stop moving its heartbeat_at
// while its presence stays fresh.
type handmade struct {
	pool, id string

	mu        sync.Mutex
	succeeded uint64
	failed    uint64
	started   time.Time // started_at
	frozen    bool      // heartbeat_at stops moving; the record is still refreshed
	draining  bool      // drained (by an operator: see drain; or obeying, see holdOrders)
	holding   bool      // obeyed drain and undrain orders show in draining
	away      bool      // no record is written (see leave)
	kv        jetstream.KeyValue
	beatAt    time.Time // heartbeat_at of the last record written
	orders    []string
}

// answer scripts the control responder: the reply to the n-th order of op
// (1-based), or nil to leave it unanswered (the request times out).
type answer func(op string, n int) []byte

// obey answers every order OK.
func obey(string, int) []byte { return protocol.OKReply("") }

// startHandmade announces pool.id, refreshes its presence every 250 ms and
// answers its control subject with reply, until the test ends.
func startHandmade(t *testing.T, b *bundle, pool, id string, reply answer) *handmade {
	t.Helper()
	nc, js := b.srv.Connect(t)
	kv, err := js.KeyValue(context.Background(), protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	h := &handmade{pool: pool, id: id, kv: kv}
	counts := map[string]int{}
	sub, err := nc.Subscribe(protocol.AgentControlSubject(pool, id), func(m *nats.Msg) {
		var c protocol.Control
		_ = json.Unmarshal(m.Data, &c)
		h.mu.Lock()
		h.orders = append(h.orders, c.Op)
		counts[c.Op]++
		n := counts[c.Op]
		h.mu.Unlock()
		if r := reply(c.Op, n); r != nil {
			h.mu.Lock()
			if h.holding && (c.Op == protocol.ControlDrain || c.Op == protocol.ControlUndrain) {
				h.draining = c.Op == protocol.ControlDrain
			}
			h.mu.Unlock()
			_ = m.Respond(r)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	h.started = time.Now().UTC()
	put := func(ctx context.Context) error {
		h.mu.Lock()
		if h.away {
			h.mu.Unlock()
			return nil
		}
		if !h.frozen {
			h.beatAt = time.Now().UTC()
		}
		p := protocol.Presence{ID: id, Pool: pool, MaxConcurrent: 4, Succeeded: h.succeeded, Failed: h.failed,
			Version: "handmade", Host: "test", StartedAt: h.started, HeartbeatAt: h.beatAt,
			HeartbeatInterval: protocol.Duration(250 * time.Millisecond), Draining: h.draining}.Routed(streams.DefaultTaskShards)
		h.mu.Unlock()
		v, _ := json.Marshal(p)
		_, err := kv.Put(ctx, protocol.PresenceKey(pool, id), v)
		return err
	}
	if err := put(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = put(ctx)
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = sub.Unsubscribe()
	})
	return h
}

// report sets the cumulative counters of the next records.
// drain makes the next records say the agent drains, as one an operator
// drained does (not through this test's control subscription).
func (h *handmade) drain() {
	h.mu.Lock()
	h.draining = true
	h.mu.Unlock()
}

// holdOrders makes the drain and undrain orders it obeys show in its
// records, as a real agent's do.
func (h *handmade) holdOrders() {
	h.mu.Lock()
	h.holding = true
	h.mu.Unlock()
}

// leave deletes its presence and writes none until back: the process is
// still there (it keeps what it was ordered) but out of sight, as in a
// long pause or a partition.
func (h *handmade) leave(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	h.away = true
	h.mu.Unlock()
	if err := h.kv.Delete(context.Background(), protocol.PresenceKey(h.pool, h.id)); err != nil {
		t.Fatal(err)
	}
}

// back makes it write its records again.
func (h *handmade) back() {
	h.mu.Lock()
	h.away = false
	h.mu.Unlock()
}

func (h *handmade) report(succeeded, failed uint64) {
	h.mu.Lock()
	h.succeeded, h.failed = succeeded, failed
	h.mu.Unlock()
}

// restart makes the next records those of a new process of the agent,
// with these counters.
func (h *handmade) restart(succeeded, failed uint64) {
	h.mu.Lock()
	h.started = time.Now().UTC()
	h.succeeded, h.failed = succeeded, failed
	h.mu.Unlock()
}

// freeze stops heartbeat_at moving: the leader sees the record refreshed
// but no new heartbeat, as if it were missing them.
func (h *handmade) freeze() {
	h.mu.Lock()
	h.frozen = true
	h.mu.Unlock()
}

func (h *handmade) Orders() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.orders...)
}

// healthConfig writes a health file with body and returns its path.
func healthConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "health.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// supervisorStoppable starts a supervisor on its own connection and
// returns it with a stop that waits for it to end.
func (b *bundle) supervisorStoppable(t *testing.T, cfg supervisor.Config) (*supervisor.Supervisor, func()) {
	t.Helper()
	vnc, _ := b.srv.Connect(t)
	v, err := supervisor.New(cfg, vnc, testLogger(t, "supervisor"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return v, run(t, "supervisor", v.Run)
}

// healingOf returns the healing events of agent as action/level/outcome,
// oldest first.
func (b *bundle) healingOf(t *testing.T, agent string) []protocol.Event {
	t.Helper()
	var out []protocol.Event
	for _, e := range b.events(t, protocol.EventHealing) {
		if e.Agent == agent {
			out = append(out, e)
		}
	}
	return out
}

func lastOrder(orders []string) string {
	if len(orders) == 0 {
		return ""
	}
	return orders[len(orders)-1]
}

// An agent an operator drained is left alone by self-healing: it takes no
// hold, so it never undrains it. It drained the agent again when it turned
// critical (no change on the agent, which keeps one drain flag), recorded
// the drain as its own, and undrained it once the agent recovered: a host
// the operator had taken out of service took tasks again.
//
// Old code: "orders [drain undrain]: healing ordered an agent an operator
// had drained".
func TestHealingLeavesAnOperatorsDrainAlone(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	v, _ := b.supervisorStoppable(t, healingConfig())
	waitClosed(t, v.Leading(), "the supervisor leads")
	a := startHandmade(t, b, "default", "x", obey)
	key := protocol.PresenceKey("default", "x")
	natstest.Eventually(t, 20*time.Second, "assessed", func() bool {
		_, ok := b.healthRecord(t, key)
		return ok
	})
	a.drain()
	a.report(0, 13) // critical: healing would drain it
	natstest.Eventually(t, 20*time.Second, "assessed critical", func() bool {
		r, ok := b.healthRecord(t, key)
		return ok && r.Level == health.Critical
	})
	a.report(200, 13) // recovered: healing would undo what it holds
	natstest.Eventually(t, 20*time.Second, "assessed out of critical again", func() bool {
		r, ok := b.healthRecord(t, key)
		return ok && r.Level != health.Critical
	})
	// A cycle's orders go out before its record is written.
	if o := a.Orders(); len(o) != 0 {
		t.Fatalf("orders %v: healing ordered an agent an operator had drained", o)
	}
}

// An agent healing drained that stays away longer than warden_health keeps
// records (a long pause, a partition), its process still there and still
// drained, is undrained once it is back and well. The leader forgot its
// care and the record expired: back, it was taken for an agent an
// operator had drained and left drained for good.
//
// Old code: "timed out after 30s: x undrained once back and well" (orders
// [drain]).
func TestHealingUndrainsAnAgentBackAfterItsRecordWouldHaveExpired(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	const recordTTL = 2 * time.Second
	b.healthTTL(t, recordTTL)
	v, _ := b.supervisorStoppable(t, healingConfig())
	waitClosed(t, v.Leading(), "the supervisor leads")
	a := startHandmade(t, b, "solo", "x", obey)
	a.holdOrders()
	key := protocol.PresenceKey("solo", "x")
	a.report(0, 13)
	natstest.Eventually(t, 20*time.Second, "x drained", func() bool { return lastOrder(a.Orders()) == protocol.ControlDrain })

	a.leave(t)
	// The scenario is the length of the absence: several times the TTL
	// of the health records (the old leader forgot its care after one).
	time.Sleep(3 * recordTTL)
	if r, ok := b.healthRecord(t, key); !ok || !slices.Contains(r.Held, health.HeldDrain) {
		t.Errorf("x's record after %s away: %+v (found %v), want its drain held", 3*recordTTL, r, ok)
	}
	a.report(200, 13)
	a.back()
	natstest.Eventually(t, 30*time.Second, "x undrained once back and well", func() bool {
		return lastOrder(a.Orders()) == protocol.ControlUndrain
	})
}

// healthTTL sets how long warden_health keeps a record not written again.
func (b *bundle) healthTTL(t *testing.T, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, "KV_"+protocol.BucketHealth)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxAge, cfg.Duplicates = ttl, min(cfg.Duplicates, ttl)
	if _, err := b.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

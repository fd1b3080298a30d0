package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// TestPresenceCarriesHealthFactors: an SDK agent's heartbeat carries what
// health assesses beyond its counters — its interval, utilisation, its own
// health (ReportHealth) and the tasks waiting on its consumer — and names
// its consumer, so that the record passes protocol.ValidatePresence.
func TestPresenceCarriesHealthFactors(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	cfg := testConfig("a1")
	cfg.MaxConcurrent = 1
	// Four tasks wait before the agent starts: it takes one (max_concurrent
	// 1) and three stay queued on its consumer.
	s, nc, js := natstest.Start(t, streams.Options{TaskShards: testShards, PresenceTTL: time.Second})
	subject := protocol.TaskSubject(protocol.Shard("p", "a1", testShards), "p", "a1")
	for i := range 4 {
		body, _ := json.Marshal(protocol.Task{JobID: fmt.Sprintf("j%d", i), StepID: "s", Epoch: 1, Attempt: 1, Action: "block",
			Deadline: time.Now().Add(20 * time.Second)})
		if _, err := js.Publish(context.Background(), subject, body); err != nil {
			t.Fatal(err)
		}
	}
	b := &bundle{srv: s, nc: nc, js: js}
	b.start(t, cfg, func(a *agent.Agent) {
		a.Handle("block", func(ctx context.Context, _ *agent.Task) (any, error) {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil, nil
		})
	})
	defer close(release)
	b.agent.ReportHealth(0.4)
	var p protocol.Presence
	natstest.Eventually(t, 5*time.Second, "heartbeat with every health factor", func() bool {
		var err error
		p, err = b.presence(t)
		return err == nil && p.Health != nil && *p.Health == 0.4 && p.Utilisation != nil && p.QueueDepth == 3 &&
			p.InFlight == 1
	})
	if p.HeartbeatInterval != cfg.HeartbeatInterval || p.Consumer != "a1" || *p.Utilisation < 0 || *p.Utilisation > 1 {
		t.Fatalf("presence %+v", p)
	}
	if err := protocol.ValidatePresence(protocol.PresenceKey("p", "a1"), p, testShards); err != nil {
		t.Fatalf("the agent's own record is rejected: %v", err)
	}
}

package selection_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/internal/selection"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// liveFleet is n agents' presence records in the warden_presence bucket of
// an embedded server, refreshed every second as agents do, and a selector
// fed by a presence.View watching that bucket.
type liveFleet struct {
	agents []protocol.Presence
	sel    *selection.Selector
}

func startLiveFleet(b *testing.B, n int) *liveFleet {
	b.Helper()
	srv := natstest.New(b)
	_, js := srv.Connect(b)
	srv.Ensure(b, js, streams.Options{TaskShards: 4})
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)

	f := &liveFleet{sel: selection.New()}
	start := time.Now().UTC()
	for i := range n {
		id := fmt.Sprintf("agent-%d", i)
		shard := protocol.Shard("default", id, 4)
		f.agents = append(f.agents, protocol.Presence{ID: id, Pool: "default", Actions: []string{"echo", "noop", "shell"},
			Capabilities: []string{"linux"}, MaxConcurrent: 4, InFlight: i % 2, Host: "bench", PID: i, StartedAt: start,
			TaskStream: protocol.TaskStream(shard), TaskSubject: protocol.TaskSubject(shard, "default", id)})
	}
	beat := func() {
		now := time.Now().UTC()
		for i := range f.agents {
			p := f.agents[i]
			p.HeartbeatAt = now
			body, _ := json.Marshal(p)
			msg := nats.NewMsg("$KV." + protocol.BucketPresence + "." + protocol.PresenceKey(p.Pool, p.ID))
			msg.Data = body
			if _, err := js.PublishMsgAsync(msg); err != nil {
				b.Errorf("heartbeat: %v", err)
				return
			}
		}
		<-js.PublishAsyncComplete()
	}
	beat()
	view, err := presence.NewView(ctx, js, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	view.Feed(f.sel)
	go func() { _ = view.Run(ctx) }()
	go func() { // heartbeats every second, as agents send them
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				beat()
			}
		}
	}()
	<-view.Ready()
	natstest.Eventually(b, 30*time.Second, "every agent present", func() bool {
		_, err := f.sel.Peek(selection.Request{Pool: "default", Action: "noop", Agent: f.agents[n-1].ID})
		return err == nil && len(view.Pool("default")) == n
	})
	return f
}

// BenchmarkDecisionLiveView is one dispatch decision against a selector fed
// by a live presence.View (real presence records on an embedded server,
// refreshed every second while the benchmark runs): Choose, then Release
// when the task's result comes back, as the dispatcher and the result
// handler do. Half the requests are untargeted, half pinned to an agent.
// Target (issue 14): at most 50 µs at 5,000 agents.
func BenchmarkDecisionLiveView(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		b.Run(fmt.Sprintf("agents_%d", n), func(b *testing.B) {
			f := startLiveFleet(b, n)
			reqs := make([]selection.Request, 2*n)
			for i := range reqs {
				reqs[i] = selection.Request{Pool: "default", Action: "noop", Requires: []string{"linux"}}
				if i%2 == 1 {
					reqs[i].Agent = f.agents[(i/2)%n].ID
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			mean, errs := selection.MeasureDecisions(f.sel, reqs, b.N)
			b.ReportMetric(float64(mean.Nanoseconds())/1000, "µs/decision")
			if errs > b.N/100 {
				b.Errorf("%d of %d decisions found no agent", errs, b.N)
			}
		})
	}
}

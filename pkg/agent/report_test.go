package agent_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// A result publish whose PubAck never comes (the request reached a server
// that was shutting down) is sent again after a short wait; it used to wait
// for the step's deadline, the task held in the meantime by the lease
// keeper (the consumer showed it unacked and never redelivered). Here the
// results stream is gone and a silent subscriber takes the first publish;
// once the stream is back the result is stored long before the deadline.
func TestLostPubAckIsRetriedLongBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t, testConfig("unanswered"), func(a *agent.Agent) {
		a.Handle("work", func(context.Context, *agent.Task) (any, error) { return "done", nil })
	})
	ctx := context.Background()
	if err := b.js.DeleteStream(ctx, protocol.StreamResults); err != nil {
		t.Fatal(err)
	}
	first := make(chan struct{})
	var once sync.Once
	silent, err := b.nc.Subscribe(protocol.SubjectResultPrefix+".>", func(*nats.Msg) { once.Do(func() { close(first) }) })
	if err != nil {
		t.Fatal(err)
	}
	b.publish(t, protocol.Task{JobID: "job-lost", StepID: "s", Action: "work", Deadline: time.Now().Add(2 * time.Minute)})
	select {
	case <-first:
	case <-time.After(20 * time.Second):
		t.Fatal("no result published")
	}
	_ = silent.Unsubscribe()
	b.srv.Ensure(t, b.js, streams.Options{TaskShards: testShards, PresenceTTL: time.Second})
	start := time.Now()
	if r, _ := b.result(t, "job-lost", "s"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("result %s: %s", r.Status, r.Error)
	}
	t.Logf("result stored %s after the stream came back", time.Since(start).Round(time.Millisecond))
}

// A server whose max_payload is below the agent's max_result_bytes refuses
// a large result before it is sent, every time: the result is cut to what
// the server takes. Before, the publish was retried until the step's
// deadline, and the step ran again and again the same way.
func TestResultFitsTheServersMaxPayload(t *testing.T) {
	t.Parallel()
	srv := natstest.NewLimited(t, 256<<10)
	nc, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{TaskShards: testShards, PresenceTTL: time.Second})
	b := &bundle{srv: srv, nc: nc, js: js}
	cfg := testConfig("a1")
	cfg.MaxResultBytes = 900 << 10
	b.start(t, cfg, func(a *agent.Agent) {
		a.Handle("big", func(context.Context, *agent.Task) (any, error) {
			return map[string]string{"blob": strings.Repeat("b", 600<<10)}, nil
		})
	})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Action: "big", Deadline: time.Now().Add(time.Minute)})
	r, _ := b.result(t, "j1", "s1")
	if r.Status != protocol.ResultSucceeded || !r.Truncated || len(r.Output) > 256<<10 {
		t.Fatalf("result %s, truncated %v, %d bytes of output; want succeeded, truncated to fit 256 KiB", r.Status, r.Truncated, len(r.Output))
	}
}

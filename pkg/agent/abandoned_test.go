package agent_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// metric scrapes the agent's /metrics and returns the line of name.
func metric(t *testing.T, a *agent.Agent, name string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	a.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for line := range strings.Lines(rec.Body.String()) {
		if strings.HasPrefix(line, name+"{") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// A handler that ignores cancellation is reported without after a grace,
// but keeps its slot until it returns: with max_concurrent 1 the next task
// waits for it. Its slot (and isolation tokens) went with the report, so a
// second handler ran beside it, a suspect did not run alone, and a
// redelivery of the same task could run beside it.
func TestAbandonedHandlerKeepsItsSlot(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free)
	var stubborn atomic.Bool   // the stubborn handler is running
	next := make(chan bool, 1) // the next handler started; was stubborn running?
	cfg := testConfig("a1")
	cfg.MaxConcurrent = 1
	b := setup(t, cfg, func(a *agent.Agent) {
		a.Handle("stubborn", func(context.Context, *agent.Task) (any, error) {
			stubborn.Store(true)
			defer stubborn.Store(false)
			<-release // ignores its context
			return "too late", nil
		})
		a.Handle("next", func(context.Context, *agent.Task) (any, error) {
			next <- stubborn.Load()
			return "ran", nil
		})
	})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "stubborn", Action: "stubborn", Timeout: protocol.Duration(100 * time.Millisecond)})
	r, _ := b.result(t, "j1", "stubborn")
	if want := "handler did not return after cancellation: step deadline reached"; !strings.HasPrefix(r.Error, want) {
		t.Fatalf("stubborn: got %+v, want an error starting %q", r, want)
	}
	natstest.Eventually(t, 5*time.Second, "the stubborn task acked", func() bool { return b.taskMessages(t) == 0 })
	if got, want := metric(t, b.agent, "warden_agent_handlers_abandoned"), `} 1`; !strings.HasSuffix(got, want) {
		t.Errorf("metric %q, want the abandoned handler counted", got)
	}
	if s := b.agent.Stats(); s.InFlight != 1 {
		t.Errorf("stats %+v, want the abandoned handler in flight", s)
	}

	b.publish(t, protocol.Task{JobID: "j1", StepID: "next", Action: "next"})
	// The window in which the runtime started it at once, beside the
	// abandoned handler; now it waits for that handler to return.
	select {
	case <-next:
		t.Fatal("the next task started while the abandoned handler still ran: 2 handlers at once, max_concurrent 1")
	case <-time.After(time.Second):
	}
	free()
	select {
	case running := <-next:
		if running {
			t.Fatal("the next task started while the abandoned handler still ran")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the next task did not start within 10s of the abandoned handler returning")
	}
	if r, _ := b.result(t, "j1", "next"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("next: got %+v", r)
	}
	natstest.Eventually(t, 5*time.Second, "the abandoned handler no longer counted", func() bool {
		return strings.HasSuffix(metric(t, b.agent, "warden_agent_handlers_abandoned"), "} 0") && b.agent.Stats().InFlight == 0
	})
}

// agenttest.ErrDrop is public, but only an agenttest agent hands a task
// back unreported for it: returned by a real agent's handler it is a
// failure like any other. It was honoured everywhere, and such a task came
// back, silently, until max_deliver.
func TestErrDropFailsOutsideTheTestKit(t *testing.T) {
	t.Parallel()
	b := setup(t, testConfig("a1"), func(a *agent.Agent) {
		a.Handle("drop", func(context.Context, *agent.Task) (any, error) { return nil, agenttest.ErrDrop })
	})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Action: "drop"})
	r, _ := b.result(t, "j1", "s1")
	if r.Status != protocol.ResultFailed || r.Error != agenttest.ErrDrop.Error() {
		t.Fatalf("got %+v, want the failure reported", r)
	}
	if h := b.agent.Stats().HandedBack; h != 0 {
		t.Fatalf("%d hand-backs, want none", h)
	}
}

// A delivery the agent holds is no ghost before it runs either: here the
// report that a task expired in its queue keeps failing (the results stream
// is gone) for several leases. Counted in flight only once it could run,
// the idle ghost check took it for a delivery lost in transit and deleted
// and re-created the task consumer under it (ghosts.go).
func TestHeldDeliveryIsNoGhost(t *testing.T) {
	t.Parallel()
	cfg := testConfig("a1")
	// Pulls (1s) end empty between redeliveries (3s): the ghost check runs
	// when a pull finds nothing.
	cfg.Lease = protocol.Duration(3 * time.Second)
	cfg.MaxDeliver = 100
	b := setup(t, cfg, nil)
	if err := b.js.DeleteStream(context.Background(), protocol.StreamResults); err != nil {
		t.Fatal(err)
	}
	created := b.consumerInfo(t).Created
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Action: "echo",
		ExpiresAt: time.Now().Add(-time.Minute), Deadline: time.Now().Add(30 * time.Second)})

	// Unextended, the delivery comes again every lease; each redelivery is
	// left to the report in progress. Three leases give the ghost check
	// (two sightings a lease apart) ample time.
	shard := protocol.Shard("p", "a1", testShards)
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := jsConsumerInfo(b.js, protocol.TaskStream(shard), "a1")
		if err != nil || !info.Created.Equal(created) {
			t.Fatalf("task consumer deleted or re-created (%v) while the agent held its delivery", err)
		}
		if info.Delivered.Consumer >= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("delivered %d times in 30s, want 4", info.Delivered.Consumer)
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.srv.Ensure(t, b.js, streams.Options{TaskShards: testShards, PresenceTTL: time.Second})
	r, _ := b.result(t, "j1", "s1")
	if r.Status != protocol.ResultFailed || !strings.HasPrefix(r.Error, "expired: not started by") {
		t.Fatalf("got %+v, want the expiry reported", r)
	}
}

func jsConsumerInfo(js jetstream.JetStream, stream, name string) (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, stream, name)
	if err != nil {
		return nil, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, errors.Join(errors.New("consumer info"), err)
	}
	return info, nil
}

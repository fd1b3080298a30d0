package agent_test

import (
	"context"
	"encoding/json"
	"errors"
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

// limitedBundle is an agent on a server that takes messages of at most
// maxPayload bytes.
func limitedBundle(t *testing.T, maxPayload int32, cfg agent.Config, register func(*agent.Agent)) *bundle {
	t.Helper()
	srv := natstest.NewLimited(t, maxPayload)
	nc, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{TaskShards: testShards, PresenceTTL: time.Second})
	b := &bundle{srv: srv, nc: nc, js: js}
	b.start(t, cfg, register)
	return b
}

// truncatedOutput is the output of a result whose output was cut.
type truncatedOutput struct {
	Truncated     bool   `json:"truncated"`
	OriginalBytes int    `json:"original_bytes"`
	Head          string `json:"head"`
}

// A result cut to fit the server's max_payload names the size of the
// handler's output in original_bytes. Its error and output here are heavy
// to escape (an HTML error page, quotes), so that the first cut, which
// only estimated the escaping, was still refused for its size and cut
// again to a floor: original_bytes then named the size of the first cut.
func TestTruncatedResultNamesTheOutputsOriginalSize(t *testing.T) {
	t.Parallel()
	const maxPayload = 256 << 10
	output := strings.Repeat(`"`, 600<<10)
	encoded, err := json.Marshal(output)
	if err != nil {
		t.Fatal(err)
	}
	b := limitedBundle(t, maxPayload, testConfig("a1"), func(a *agent.Agent) {
		a.Handle("big", func(context.Context, *agent.Task) (any, error) {
			return output, agent.Permanent(errors.New("upstream answered " + strings.Repeat("<br>", 5<<10)))
		})
	})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Action: "big", Deadline: time.Now().Add(time.Minute)})
	r, msg := b.result(t, "j1", "s1")
	var out truncatedOutput
	if err := json.Unmarshal(r.Output, &out); err != nil {
		t.Fatalf("output %.200s: %v", r.Output, err)
	}
	if r.Status != protocol.ResultFailed || !r.Truncated || !out.Truncated || !strings.HasPrefix(r.Error, "upstream answered <br>") {
		t.Fatalf("result %s, truncated %v, error %.40q, output %.200s; want failed, truncated, the error's start kept", r.Status, r.Truncated, r.Error, r.Output)
	}
	if out.OriginalBytes != len(encoded) {
		t.Fatalf("original_bytes %d, want the handler's output size %d", out.OriginalBytes, len(encoded))
	}
	if !strings.HasPrefix(out.Head, `"\"\"`) || len(msg.Data()) > maxPayload {
		t.Fatalf("head %.20q…, %d bytes of result; want the output's start, within %d bytes", out.Head, len(msg.Data()), maxPayload)
	}
}

// On a server with a tiny max_payload (4 KiB here: the 4 KiB headroom for
// headers leaves nothing) a result is cut to what the server takes, its
// error too. Before, the floor it was cut to kept an 8 KiB error, refused
// every time: the publish was retried until the step's deadline.
func TestResultFitsATinyMaxPayload(t *testing.T) {
	t.Parallel()
	const maxPayload = 4 << 10
	b := limitedBundle(t, maxPayload, testConfig("a1"), func(a *agent.Agent) {
		a.Handle("loud", func(context.Context, *agent.Task) (any, error) {
			return strings.Repeat("o", 100<<10), errors.New("command failed: " + strings.Repeat("e", 20<<10))
		})
	})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Action: "loud", Deadline: time.Now().Add(time.Minute)})
	r, msg := b.result(t, "j1", "s1")
	if r.Status != protocol.ResultFailed || !r.Truncated || !strings.HasPrefix(r.Error, "command failed: eee") || !strings.HasSuffix(r.Error, "(truncated)") {
		t.Fatalf("result %s, truncated %v, error %.40q…; want failed, truncated, the error's start kept", r.Status, r.Truncated, r.Error)
	}
	var out truncatedOutput
	if err := json.Unmarshal(r.Output, &out); err != nil || !out.Truncated || out.OriginalBytes != 100<<10+2 {
		t.Fatalf("output %.200s (%v); want it truncated, original_bytes %d", r.Output, err, 100<<10+2)
	}
	if n := len(msg.Data()); n > maxPayload {
		t.Fatalf("result of %d bytes stored by a server that takes %d", n, maxPayload)
	}
}

package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// A restarted nats-server has forgotten the agent's pull request. The agent
// asks again as soon as it reconnects: without that it learned of the loss
// only when two of the request's 5 s heartbeats had not come (5-10 s after
// the restart), and tasks waited meanwhile. The 4 s deadline below is
// shorter than that.
func TestPullAskedAgainAfterServerRestart(t *testing.T) {
	t.Parallel()
	s, _, _ := natstest.Start(t, streams.Options{TaskShards: testShards})
	nc, js := s.ConnectReconnecting(t, 20*time.Millisecond)
	b := &bundle{srv: s, nc: nc, js: js}
	cfg := testConfig("a1")
	cfg.FetchWait = protocol.Duration(30 * time.Second) // pull requests with 5 s heartbeats
	b.start(t, cfg, nil)
	b.publish(t, protocol.Task{JobID: "before", StepID: "s", Action: "echo"})
	b.result(t, "before", "s")

	s.Down()
	s.Up(t)
	natstest.Eventually(t, 10*time.Second, "client reconnected", nc.IsConnected)
	b.publish(t, protocol.Task{JobID: "after", StepID: "s", Action: "echo"})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	cons, err := js.CreateConsumer(ctx, protocol.StreamResults, jetstream.ConsumerConfig{
		FilterSubject: "warden.result.*.*.*.after.s", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cons.Next(jetstream.FetchContext(ctx)); err != nil {
		t.Fatalf("no result within 4 s of the restart: the agent did not pull again (%v)", err)
	}
}

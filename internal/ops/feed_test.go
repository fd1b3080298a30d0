package ops_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// A feed that failed at start (WARDEN_EVENTS not there yet) said nothing
// until the other feed ended at shutdown, and the healing and failover
// metrics stayed missing. It is logged at once now and started again until
// it runs; the events stored meanwhile are counted.
func TestFeedThatFailsIsLoggedAndStartedAgain(t *testing.T) {
	t.Parallel()
	srv, nc, js := natstest.Start(t, streams.Options{TaskShards: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, protocol.StreamEvents); err != nil {
		t.Fatal(err)
	}
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	var logs natstest.Buffer
	reg := prometheus.NewRegistry()
	feed := ops.NewFeed(ops.New(nc, store), reg, zerolog.New(&logs))
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- feed.Run(rctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("feed: %v", err)
		}
	}()

	natstest.Eventually(t, 10*time.Second, "the events feed's failure logged while the feed runs", func() bool {
		return strings.Contains(logs.String(), `"feed":"events"`)
	})
	t.Logf("logged: %s", logs.String())

	srv.Ensure(t, js, streams.Options{TaskShards: 1}) // WARDEN_EVENTS is there now
	ev := protocol.Event{Kind: protocol.EventHealing, ID: "e1", Time: time.Now().UTC(), Agent: "a1", Data: map[string]string{"action": "drain"}}
	m := nats.NewMsg(protocol.EventSubject(protocol.EventHealing, "e1"))
	m.Data, _ = json.Marshal(ev)
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	drains := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "warden_healing_actions_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "type" && l.GetValue() == "drain" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return -1
	}
	natstest.Eventually(t, 20*time.Second, "the restarted events feed counts the healing action", func() bool { return drains() == 1 })
}

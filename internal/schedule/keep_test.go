package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// TestRelayRecreatesLostConsumer: the schedule relay's consumer is deleted
// (`nats consumer rm`) while the relay runs; the relay creates it again
// and the ticks of a schedule added afterwards are relayed.
func TestRelayRecreatesLostConsumer(t *testing.T) {
	t.Parallel()
	srv, _, js := natstest.Start(t, streams.Options{})
	got := collect(t, js)
	startRelay(t, srv)
	ctx := context.Background()
	if err := js.DeleteConsumer(ctx, streams.StreamSchedules, schedule.RelayConsumer); err != nil {
		t.Fatal(err)
	}
	addSchedule(t, js, schedule.Definition{Name: "lost", Schedule: "@every 1s", Spec: everySecond})
	natstest.Eventually(t, 10*time.Second, "a tick relayed after the consumer was deleted", func() bool {
		return len(got.ticks("lost")) >= 1
	})
	t.Logf("ticks %v", got.ticks("lost"))
}

// TestDelayRelayRecreatesLostConsumer: the delay relay's consumer is
// deleted while it runs; it creates it again and a delayed submission
// published afterwards is released and submitted.
func TestDelayRelayRecreatesLostConsumer(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.Start(t, streams.Options{})
	got := collect(t, js)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	relayed := make(chan error, 1)
	go func() {
		relayed <- schedule.RunDelayRelay(ctx, js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel))
	}()
	defer func() {
		cancel()
		if err := <-relayed; err != nil {
			t.Errorf("delay relay: %v", err)
		}
	}()
	natstest.Eventually(t, 10*time.Second, "the delay relay's consumer exists", func() bool {
		_, err := js.Consumer(ctx, protocol.StreamDelay, schedule.DelayRelayConsumer)
		return err == nil
	})
	if err := js.DeleteConsumer(ctx, protocol.StreamDelay, schedule.DelayRelayConsumer); err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(protocol.SubmitSubject("lost-1"))
	msg.Data = []byte(`{"name":"lost","delay":"1s","steps":[{"id":"a","action":"echo"}]}`)
	msg.Header.Set(protocol.HeaderJobID, "lost-1")
	msg.Header.Set(protocol.HeaderMsgID, "lost-1")
	if _, err := schedule.PublishDelayed(ctx, js, msg, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, "the delayed submission relayed after the consumer was deleted", func() bool {
		return len(got.ticks("lost")) == 1
	})
}

package schedule_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// A relay consumer created again (deleted, lost with its state, a stream
// restored) delivers every schedule's last tick anew. A tick relayed
// already, whose next timer is armed, is dropped: submitted again, it made
// a second job once the first one's record had expired (the job id is the
// only guard past the stream's duplicate window). A core subscription sees
// every publish, the ones the stream drops as duplicates too.
//
// Old code: "tick … submitted 2 times".
func TestRecreatedRelayConsumerDoesNotSubmitTheLastTickAgain(t *testing.T) {
	t.Parallel()
	srv, nc, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	subs, err := nc.SubscribeSync(protocol.SubjectSubmit + ".>")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = subs.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	startRelay(t, srv)
	// One tick in a second, the next an hour later.
	d := schedule.Definition{Name: "hourly", Schedule: "@every 1h", Spec: everySecond,
		CreatedAt: time.Now().UTC().Add(-time.Hour + time.Second)}
	st := addSchedule(t, js, d)
	first, err := subs.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no tick submitted: %v", err)
	}
	job := first.Header.Get(protocol.HeaderJobID)
	natstest.Eventually(t, 10*time.Second, "the next tick armed", func() bool {
		e, err := st.Get(ctx, "hourly")
		return err == nil && e.Next.After(e.LastTick) && !e.LastTick.IsZero()
	})
	if err := js.DeleteConsumer(ctx, streams.StreamSchedules, schedule.RelayConsumer); err != nil {
		t.Fatal(err)
	}
	// The consumer is created again and delivers the last tick: once it
	// has been acknowledged, the relay has handled it.
	// Bounded generously: under make test's load one run took over 15 s
	// (the consumer's loss noticed, re-created, its pull resumed).
	natstest.Eventually(t, 45*time.Second, "the last tick delivered again and handled", func() bool {
		c, err := js.Consumer(ctx, streams.StreamSchedules, schedule.RelayConsumer)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.Delivered.Consumer >= 1 && info.NumAckPending == 0 && info.NumPending == 0
	})
	n := 1
	for {
		m, err := subs.NextMsg(200 * time.Millisecond)
		if err == nats.ErrTimeout {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(protocol.HeaderJobID) == job {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("tick %s submitted %d times", job, n)
	}
}

// A definition with no timer of its own (its writer's arming failed, or
// it was written by hand) is armed by a running relay, not only by one
// that starts: the schedule never fired while the schedulers ran.
//
// Old code: "timed out after 10s: a tick of the definition written by hand".
func TestRunningRelayArmsADefinitionWithoutATimer(t *testing.T) {
	t.Parallel()
	srv, _, js := natstest.Start(t, streams.Options{})
	got := collect(t, js)
	_, rjs := srv.Connect(t)
	r := schedule.NewRelay(rjs, schedule.WithLogger(zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)),
		schedule.WithReconcileEvery(500*time.Millisecond))
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	var err error
	m := nats.NewMsg(protocol.ScheduleDefSubject("byhand"))
	m.Data, err = json.Marshal(schedule.Definition{Name: "byhand", Schedule: "@every 1s", Spec: everySecond, CreatedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(context.Background(), m, jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, "a tick of the definition written by hand", func() bool {
		return len(got.ticks("byhand")) >= 1
	})
}

package schedule

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// Reconcile leaves alone a schedule whose last tick the relays have not
// acknowledged: that tick's relay arms the next timer (with
// Warden-Schedule-After). Armed by Reconcile too, the timer could replace
// the relay's, or fire a later tick over the one still being relayed.
//
// Old code: "Reconcile armed a timer (next …) over a tick not yet relayed".
func TestReconcileLeavesATickBeingRelayedAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, st := storeForTest(t)
	if _, err := js.CreateOrUpdateConsumer(ctx, streams.StreamSchedules, relayConsumerConfig()); err != nil {
		t.Fatal(err)
	}
	addEverySecond(t, st, "pending")
	waitFired(t, st, "pending")
	r := NewRelay(js)
	r.store = st
	if err := r.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if e, err := st.Get(ctx, "pending"); err != nil || !e.Next.IsZero() {
		t.Fatalf("Reconcile armed a timer (next %v, %v) over a tick not yet relayed", e.Next, err)
	}
}

// A tick whose relaying keeps failing holds the relay consumer's ack
// floor down, for every schedule that ticked after it too; Reconcile
// leaves those alone only for a while (quiet), then arms the ones with no
// timer. It left them alone for as long as that one tick was not
// acknowledged: with an undecodable definition, for ever.
//
// Old code (3679cb5): "y has no timer: x's pending tick blocks it".
func TestReconcileIsNotHeldForEverByAnotherSchedulesTick(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, st := storeForTest(t)
	c, err := js.CreateOrUpdateConsumer(ctx, streams.StreamSchedules, relayConsumerConfig())
	if err != nil {
		t.Fatal(err)
	}
	fetch := func() jetstream.Msg {
		t.Helper()
		b, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var got jetstream.Msg
		for m := range b.Messages() {
			got = m
		}
		if got == nil {
			t.Fatal("no tick delivered")
		}
		return got
	}
	addEverySecond(t, st, "x")
	waitFired(t, st, "x")
	x := fetch() // held unacknowledged: its relaying keeps failing
	addEverySecond(t, st, "y")
	waitFired(t, st, "y")
	if err := fetch().DoubleAck(ctx); err != nil { // y's tick relayed, its arming lost
		t.Fatal(err)
	}
	r := NewRelay(js)
	r.store, r.quiet = st, time.Second
	natstest.Eventually(t, 10*time.Second, "y armed by Reconcile", func() bool {
		_ = x.InProgress()
		if err := r.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		e, err := st.Get(ctx, "y")
		return err == nil && !e.Next.IsZero()
	})
}

// storeForTest is a server with the workflow streams and a Store on it.
func storeForTest(t *testing.T) (jetstream.JetStream, *Store) {
	t.Helper()
	_, _, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	if err := streams.EnsureWorkflow(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	st, err := NewStore(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	return js, st
}

// oneStepSpec is a schedule's job spec of one echo step.
const oneStepSpec = `{"name":"a","steps":[{"id":"a","action":"echo"}]}`

// addEverySecond adds schedule name, @every 1s.
func addEverySecond(t *testing.T, st *Store, name string) {
	t.Helper()
	if _, err := st.Add(context.Background(), Definition{Name: name, Schedule: "@every 1s", Spec: oneStepSpec}, false); err != nil {
		t.Fatal(err)
	}
}

// waitFired waits until schedule name's tick has fired with no relay to
// arm the next: a last tick, no timer.
func waitFired(t *testing.T, st *Store, name string) {
	t.Helper()
	natstest.Eventually(t, 10*time.Second, name+" fired", func() bool {
		e, err := st.Get(context.Background(), name)
		return err == nil && !e.LastTick.IsZero() && e.Next.IsZero()
	})
}

// A definition that is not one (written by hand, by another version) is
// named in List's error and left out; the others are listed and armed.
// It failed the whole List: `warden schedule ls` showed nothing, and the
// relays' reconcile armed no schedule.
//
// Old code: "List: [] (decode schedule bad: invalid character …), want
// good listed".
func TestUndecodableDefinitionHidesNoOtherSchedule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, st := storeForTest(t)
	addEverySecond(t, st, "good")
	waitFired(t, st, "good")
	if _, err := js.Publish(ctx, protocol.ScheduleDefSubject("bad"), []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	list, err := st.List(ctx)
	if len(list) != 1 || list[0].Name != "good" {
		t.Fatalf("List: %v (%v), want good listed", list, err)
	}
	if !errors.Is(err, ErrUndecodable) || !strings.Contains(err.Error(), "bad") {
		t.Fatalf("List's error %v, want ErrUndecodable naming bad", err)
	}
	r := NewRelay(js)
	r.store = st
	if err := r.Reconcile(ctx); !errors.Is(err, ErrUndecodable) {
		t.Fatalf("Reconcile: %v, want ErrUndecodable for bad", err)
	}
	if e, err := st.Get(ctx, "good"); err != nil || e.Next.IsZero() {
		t.Fatalf("good not armed by Reconcile (next %v, %v)", e.Next, err)
	}
}

package schedule

import (
	"context"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"
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
	_, _, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	if err := streams.EnsureWorkflow(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, streams.StreamSchedules, relayConsumerConfig()); err != nil {
		t.Fatal(err)
	}
	st, err := NewStore(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Add(ctx, Definition{Name: "pending", Schedule: "@every 1s", Spec: `{"name":"a","steps":[{"id":"a","action":"echo"}]}`}, false); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, "a tick fired, no relay running", func() bool {
		e, err := st.Get(ctx, "pending")
		return err == nil && !e.LastTick.IsZero() && e.Next.IsZero()
	})
	r := NewRelay(js)
	r.store = st
	if err := r.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if e, err := st.Get(ctx, "pending"); err != nil || !e.Next.IsZero() {
		t.Fatalf("Reconcile armed a timer (next %v, %v) over a tick not yet relayed", e.Next, err)
	}
}

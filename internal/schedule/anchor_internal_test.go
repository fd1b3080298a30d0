package schedule

import (
	"context"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/streams"
)

// An @every schedule is anchored by the server's clock, as its ticks are:
// anchored by the adding host's clock, running an hour ahead, an @every
// 1m schedule's first tick came an hour out.
//
// Old code: "first tick 59m59s away, want within a minute".
func TestEveryAnchorIsTheServersTime(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	if err := streams.EnsureWorkflow(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	st, err := NewStore(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	st.now = func() time.Time { return time.Now().Add(time.Hour) }
	next, err := st.Add(ctx, Definition{Name: "anchored", Schedule: "@every 1m", Spec: `{"name":"a","steps":[{"id":"a","action":"echo"}]}`}, false)
	if err != nil {
		t.Fatal(err)
	}
	if away := time.Until(next); away > time.Minute+5*time.Second {
		t.Fatalf("first tick %v away, want within a minute", away.Round(time.Second))
	}
}

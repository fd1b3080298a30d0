package schedule

import (
	"context"
	"testing"
	"time"
)

// An @every schedule is anchored by the server's clock, as its ticks are:
// anchored by the adding host's clock, running an hour ahead, an @every
// 1m schedule's first tick came an hour out.
//
// Old code: "first tick 59m59s away, want within a minute".
func TestEveryAnchorIsTheServersTime(t *testing.T) {
	t.Parallel()
	_, st := storeForTest(t)
	st.now = func() time.Time { return time.Now().Add(time.Hour) }
	next, err := st.Add(context.Background(), Definition{Name: "anchored", Schedule: "@every 1m", Spec: oneStepSpec}, false)
	if err != nil {
		t.Fatal(err)
	}
	if away := time.Until(next); away > time.Minute+5*time.Second {
		t.Fatalf("first tick %v away, want within a minute", away.Round(time.Second))
	}
}

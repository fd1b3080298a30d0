package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/streams"
)

// TestRelayClockAhead: the relay's host clock is 5 s ahead of the server,
// which fires an @every 2s schedule by its own. Lateness and the next tick
// are the server's business: with catchup skip the ticks are still
// submitted (none is overdue), and with run_once they come every 2 s.
func TestRelayClockAhead(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{schedule.CatchupSkip, schedule.CatchupRunOnce} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			srv, _, js := natstest.Start(t, streams.Options{})
			got := collect(t, js)
			addSchedule(t, js, schedule.Definition{Name: "skew", Schedule: "@every 2s", Catchup: policy, Spec: everySecond})
			_, rjs := srv.Connect(t)
			r := schedule.NewRelay(rjs, schedule.WithClock(func() time.Time { return time.Now().Add(5 * time.Second) }),
				schedule.WithLogger(zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)))
			if err := r.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Stop)
			natstest.Eventually(t, 20*time.Second, "3 ticks submitted", func() bool { return len(got.ticks("skew")) >= 3 })
			ticks := got.ticks("skew")
			for i := 1; i < len(ticks); i++ {
				if ticks[i] != ticks[i-1]+2 {
					t.Fatalf("ticks %v are not every 2 s", ticks)
				}
			}
			t.Logf("%s, relay clock 5 s ahead: ticks %v", policy, ticks)
		})
	}
}

package schedule_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
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

// heldRelay starts a relay whose clock, once hold is called, blocks the
// first time the relay reads it (handling a tick: after it has read the
// tick's definition, before it re-arms the timer) until release. held is
// closed when the relay is blocked there.
type heldRelay struct {
	*schedule.Relay
	holding atomic.Bool
	once    sync.Once
	held    chan struct{}
	release func()
}

func startHeldRelay(t *testing.T, srv *natstest.Server) *heldRelay {
	t.Helper()
	h := &heldRelay{held: make(chan struct{})}
	released := make(chan struct{})
	h.release = sync.OnceFunc(func() { close(released) })
	clock := func() time.Time {
		if h.holding.Load() {
			h.once.Do(func() {
				close(h.held)
				<-released
			})
		}
		return time.Now()
	}
	_, js := srv.Connect(t)
	h.Relay = schedule.NewRelay(js, schedule.WithClock(clock),
		schedule.WithLogger(zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)))
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	t.Cleanup(h.release) // runs first: a failed test must not leave Stop waiting
	return h
}

// hold makes the relay block in its next tick; it returns once it does.
func (h *heldRelay) hold(t *testing.T) {
	t.Helper()
	h.holding.Store(true)
	select {
	case <-h.held:
	case <-time.After(10 * time.Second):
		t.Fatal("no tick reached the relay")
	}
}

// clearOfSecond waits until the wall clock is a little past a whole second,
// so that an @every 1s schedule (ticking on whole seconds) armed now does
// not fire within the next few hundred milliseconds.
func clearOfSecond() {
	frac := time.Duration(time.Now().Nanosecond())
	if frac < 50*time.Millisecond || frac > 400*time.Millisecond {
		time.Sleep(time.Second - frac + 50*time.Millisecond)
	}
}

// TestRearmNeverReplacesNewerDefinition: a relay is held between reading
// the definition of the tick it relays and re-arming the schedule's timer,
// while the schedule is replaced (schedule add --replace), removed and
// added again, or removed. The relay's re-arm must not replace the timer
// the new definition armed (whose ticks must keep coming), nor leave a
// timer behind a removed schedule.
func TestRearmNeverReplacesNewerDefinition(t *testing.T) {
	t.Parallel()
	for _, change := range []string{"replace", "remove_then_add", "remove"} {
		t.Run(change, func(t *testing.T) {
			t.Parallel()
			srv, _, js := natstest.Start(t, streams.Options{})
			got := collect(t, js)
			d := schedule.Definition{Name: "race", Schedule: "@every 1s", Spec: everySecond}
			st := addSchedule(t, js, d)
			r := startHeldRelay(t, srv)
			r.hold(t)
			ctx := context.Background()
			clearOfSecond()
			changed := time.Now().Unix()
			switch change {
			case "replace":
				if _, err := st.Add(ctx, d, true); err != nil {
					t.Fatal(err)
				}
			case "remove_then_add":
				if err := st.Remove(ctx, d.Name); err != nil {
					t.Fatal(err)
				}
				if _, err := st.Add(ctx, d, false); err != nil {
					t.Fatal(err)
				}
			case "remove":
				if err := st.Remove(ctx, d.Name); err != nil {
					t.Fatal(err)
				}
			}
			r.release()
			if change == "remove" {
				r.Stop() // returns once the held tick is handled
				sched, err := js.Stream(ctx, streams.StreamSchedules)
				if err != nil {
					t.Fatal(err)
				}
				for _, subj := range []string{protocol.ScheduleTimerSubject(d.Name), protocol.ScheduleTickSubject(d.Name)} {
					if m, err := sched.GetLastMsgForSubject(ctx, subj); !errors.Is(err, jetstream.ErrMsgNotFound) {
						t.Fatalf("removed schedule still has %s (%v): a timer was armed after the removal", subj, msgOrErr(m, err))
					}
				}
				return
			}
			after := func() []int64 {
				var out []int64
				for _, tk := range got.ticks(d.Name) {
					if tk > changed {
						out = append(out, tk)
					}
				}
				return out
			}
			natstest.Eventually(t, 20*time.Second, "5 ticks of the new definition", func() bool { return len(after()) >= 5 })
			if d := got.dups(); len(d) > 0 {
				t.Fatalf("jobs submitted twice: %v", d)
			}
			if ticks := after(); !consecutive(ticks) {
				t.Fatalf("ticks after the change %v are not one per second", ticks)
			}
			e, err := st.Get(ctx, d.Name)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s while a tick was relayed: ticks after it %v, definition at revision %d", change, after(), e.Rev)
		})
	}
}

func msgOrErr(m *jetstream.RawStreamMsg, err error) any {
	if err != nil {
		return err
	}
	return m.Header
}

// TestStaleTickArmsCurrentDefinition: a definition replaced by a writer
// that died before arming its first timer (here: written by hand). The old
// definition's tick, when it fires, must not just be dropped: the relay
// arms the current definition, whose ticks then come.
func TestStaleTickArmsCurrentDefinition(t *testing.T) {
	t.Parallel()
	srv, _, js := natstest.Start(t, streams.Options{})
	got := collect(t, js)
	ctx := context.Background()
	st := addSchedule(t, js, schedule.Definition{Name: "hand", Schedule: "@every 1h", Spec: everySecond})
	// Arm the old definition's timer for the next second, as a relay would
	// have; then replace the definition without arming it.
	e, err := st.Get(ctx, "hand")
	if err != nil {
		t.Fatal(err)
	}
	soon := time.Now().Add(time.Second).Truncate(time.Second)
	timer := nats.NewMsg(protocol.ScheduleTimerSubject("hand"))
	timer.Header.Set(protocol.HeaderNatsSchedule, "@at "+soon.UTC().Format(time.RFC3339Nano))
	timer.Header.Set(protocol.HeaderNatsScheduleTarget, protocol.ScheduleTickSubject("hand"))
	timer.Header.Set(protocol.HeaderSchedule, "hand")
	timer.Header.Set(protocol.HeaderScheduleTick, soon.UTC().Format(time.RFC3339Nano))
	timer.Header.Set(protocol.HeaderScheduleRev, strconv.FormatUint(e.Rev, 10))
	if _, err := js.PublishMsg(ctx, timer); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(schedule.Definition{Name: "hand", Schedule: "@every 1s", Catchup: schedule.CatchupRunOnce,
		Spec: everySecond, CreatedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, protocol.ScheduleDefSubject("hand"), b); err != nil {
		t.Fatal(err)
	}
	startRelay(t, srv)
	natstest.Eventually(t, 20*time.Second, "3 ticks of the definition written by hand", func() bool { return len(got.ticks("hand")) >= 3 })
	t.Logf("ticks %v", got.ticks("hand"))
}

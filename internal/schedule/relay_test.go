package schedule_test

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// jobs collects the submissions that reach WARDEN_SUBMIT, by job id, with
// how often each arrived.
type jobs struct {
	mu    sync.Mutex
	count map[string]int
}

func (j *jobs) ticks(name string) []int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []int64
	for id := range j.count {
		if s, ok := strings.CutPrefix(id, name+"-"); ok {
			n, _ := strconv.ParseInt(s, 10, 64)
			out = append(out, n)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a] < out[b] })
	return out
}

func (j *jobs) dups() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []string
	for id, n := range j.count {
		if n > 1 {
			out = append(out, id)
		}
	}
	return out
}

func collect(t *testing.T, js jetstream.JetStream) *jobs {
	t.Helper()
	ctx := context.Background()
	cons, err := js.CreateConsumer(ctx, protocol.StreamSubmit, jetstream.ConsumerConfig{
		Durable: "test", FilterSubject: protocol.SubjectSubmit + ".*.*", AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	j := &jobs{count: map[string]int{}}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		j.mu.Lock()
		j.count[m.Headers().Get(protocol.HeaderJobID)]++
		j.mu.Unlock()
		_ = m.Ack()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return j
}

func startRelay(t *testing.T, srv *natstest.Server) *schedule.Relay {
	t.Helper()
	_, js := srv.Connect(t)
	r := schedule.NewRelay(js, schedule.WithLogger(zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)))
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

const everySecond = `{"name":"heartbeat","steps":[{"id":"a","action":"echo"}]}`

func addSchedule(t *testing.T, js jetstream.JetStream, d schedule.Definition) *schedule.Store {
	t.Helper()
	ctx := context.Background()
	if err := streams.EnsureWorkflow(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	st, err := schedule.NewStore(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Add(ctx, d, false); err != nil {
		t.Fatal(err)
	}
	return st
}

// consecutive reports whether ticks are one second apart.
func consecutive(ticks []int64) bool {
	for i := 1; i < len(ticks); i++ {
		if ticks[i] != ticks[i-1]+1 {
			return false
		}
	}
	return true
}

// TestOneJobPerTickWithTwoSchedulers: two relays share the ticks of an
// @every 1s schedule; each tick becomes exactly one job and none is missed.
func TestOneJobPerTickWithTwoSchedulers(t *testing.T) {
	t.Parallel()
	srv, _, js := natstest.Start(t, streams.Options{})
	got := collect(t, js)
	addSchedule(t, js, schedule.Definition{Name: "hb", Schedule: "@every 1s", Spec: everySecond})
	startRelay(t, srv)
	startRelay(t, srv)
	natstest.Eventually(t, 20*time.Second, "5 ticks submitted", func() bool { return len(got.ticks("hb")) >= 5 })
	ticks := got.ticks("hb")
	if d := got.dups(); len(d) > 0 {
		t.Fatalf("jobs submitted twice: %v", d)
	}
	if !consecutive(ticks) {
		t.Fatalf("ticks %v are not one per second", ticks)
	}
	t.Logf("two relays, @every 1s: ticks %v, each submitted once", ticks)
}

// TestRestartCatchup: both relays stop (every scheduler down) long enough
// to miss several ticks, then one starts again. run_once submits the
// overdue tick once and resumes; skip drops it and resumes. No tick is
// ever submitted twice and no missed tick other than the overdue one runs.
func TestRestartCatchup(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{schedule.CatchupRunOnce, schedule.CatchupSkip} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			srv, _, js := natstest.Start(t, streams.Options{})
			got := collect(t, js)
			st := addSchedule(t, js, schedule.Definition{Name: "cu", Schedule: "@every 1s", Catchup: policy,
				Grace: protocol.Duration(500 * time.Millisecond), Spec: everySecond})
			a, b := startRelay(t, srv), startRelay(t, srv)
			natstest.Eventually(t, 20*time.Second, "3 ticks submitted", func() bool { return len(got.ticks("cu")) >= 3 })
			a.Stop()
			b.Stop()
			before := got.ticks("cu")
			last := before[len(before)-1]
			// The next tick fires into the stream with nobody to relay it;
			// wait until it is overdue and more ticks have been missed.
			ctx := context.Background()
			natstest.Eventually(t, 10*time.Second, "a tick fired while no relay ran", func() bool {
				e, err := st.Get(ctx, "cu")
				return err == nil && e.LastTick.Unix() > last
			})
			e, _ := st.Get(ctx, "cu")
			overdue := e.LastTick.Unix()
			natstest.Eventually(t, 10*time.Second, "the tick is overdue and two more were missed", func() bool {
				return time.Now().Unix() >= overdue+3
			})
			restart := time.Now().Unix()
			startRelay(t, srv) // the restarted scheduler
			natstest.Eventually(t, 20*time.Second, "ticks resume after the restart", func() bool {
				ts := got.ticks("cu")
				return ts[len(ts)-1] > restart+1
			})
			ticks := got.ticks("cu")
			if d := got.dups(); len(d) > 0 {
				t.Fatalf("jobs submitted twice: %v", d)
			}
			var missed []int64
			for _, tk := range ticks {
				if tk > last && tk <= restart {
					missed = append(missed, tk)
				}
			}
			switch policy {
			case schedule.CatchupRunOnce:
				if len(missed) != 1 || missed[0] != overdue {
					t.Fatalf("run_once: ticks while down %v, want only the overdue one %d", missed, overdue)
				}
			case schedule.CatchupSkip:
				if len(missed) != 0 {
					t.Fatalf("skip: ticks while down %v were run", missed)
				}
			}
			t.Logf("%s: last tick before the stop %d, overdue tick %d, restart at %d, ticks %v", policy, last, overdue, restart, ticks)
		})
	}
}

func TestAddValidatesAndRemove(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	st := addSchedule(t, js, schedule.Definition{Name: "nightly", Schedule: "0 3 * * *", Spec: everySecond})
	if _, err := st.Add(ctx, schedule.Definition{Name: "nightly", Schedule: "0 4 * * *", Spec: everySecond}, false); err == nil {
		t.Fatal("a second add of the same name was accepted")
	}
	for _, bad := range []schedule.Definition{
		{Name: "x", Schedule: "61 * * * *", Spec: everySecond},
		{Name: "x", Schedule: "@hourly", Spec: `{"name":"x","idempotency_key":"k","steps":[{"id":"a","action":"echo"}]}`},
		{Name: "x", Schedule: "@hourly", Spec: `{"name":"x","steps":[]}`},
		{Name: "x.y", Schedule: "@hourly", Spec: everySecond},
		{Name: "x", Schedule: "@hourly", Catchup: "all", Spec: everySecond},
		// A delay in a schedule's spec was accepted and ignored (a tick's
		// job counts as released): every tick ran at once.
		{Name: "x", Schedule: "@hourly", Spec: `{"name":"x","delay":"10m","steps":[{"id":"a","action":"echo"}]}`},
		{Name: "x", Schedule: "@hourly", Spec: `{"name":"x","run_at":"2030-01-01T00:00:00Z","steps":[{"id":"a","action":"echo"}]}`},
	} {
		if _, err := st.Add(ctx, bad, false); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	list, err := st.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "nightly" || list[0].Next.Hour() != 3 {
		t.Fatalf("list %+v %v", list, err)
	}
	if err := st.Remove(ctx, "nightly"); err != nil {
		t.Fatal(err)
	}
	if list, _ := st.List(ctx); len(list) != 0 {
		t.Fatalf("still listed after rm: %+v", list)
	}
}

package schedule_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// handledThrough reports whether the schedule name's ticks have fired
// through t (its last tick is at t or later) and every fired tick has
// been relayed (the relays' consumer has nothing pending or unacked).
func handledThrough(t *testing.T, js jetstream.JetStream, st *schedule.Store, name string, at time.Time) bool {
	t.Helper()
	ctx := context.Background()
	e, err := st.Get(ctx, name)
	if err != nil || e.LastTick.Before(at) {
		return false
	}
	c, err := js.Consumer(ctx, streams.StreamSchedules, schedule.RelayConsumer)
	if err != nil {
		return false
	}
	info, err := c.Info(ctx)
	return err == nil && info.NumPending == 0 && info.NumAckPending == 0
}

// ticksIn returns the ticks in (from, to], by wall time.
func ticksIn(ticks []int64, from, to time.Time) []int64 {
	var out []int64
	for _, tk := range ticks {
		if at := time.Unix(tk, 0); at.After(from) && !at.After(to) {
			out = append(out, tk)
		}
	}
	return out
}

// TestPauseSkipsTicksResumeRunsNextTick: two relays run an @every 1s
// schedule (catchup run_once). Paused, its ticks keep firing and are
// relayed, and none submits a job; resumed, its next job is the first
// tick after the resume, and none of the paused ticks is caught up.
func TestPauseSkipsTicksResumeRunsNextTick(t *testing.T) {
	t.Parallel()
	srv, _, js := natstest.Start(t, streams.Options{})
	got := collect(t, js)
	st := addSchedule(t, js, schedule.Definition{Name: "p", Schedule: "@every 1s", Catchup: schedule.CatchupRunOnce, Spec: everySecond})
	startRelay(t, srv)
	startRelay(t, srv)
	natstest.Eventually(t, 20*time.Second, "2 ticks submitted", func() bool { return len(got.ticks("p")) >= 2 })
	ctx := context.Background()

	e, changed, err := st.Pause(ctx, "p", "deploy freeze")
	if err != nil || !changed || !e.Paused || e.PauseReason != "deploy freeze" || e.PausedAt.IsZero() {
		t.Fatalf("pause: %+v changed %v, %v", e, changed, err)
	}
	paused := time.Now()
	natstest.Eventually(t, 20*time.Second, "3 ticks fired and relayed while paused", func() bool {
		return handledThrough(t, js, st, "p", paused.Add(3*time.Second))
	})
	if during := ticksIn(got.ticks("p"), paused, time.Now()); len(during) > 0 {
		t.Fatalf("ticks %v submitted while paused (paused at %s)", during, paused.Format(time.RFC3339Nano))
	}
	// The first tick the pause skipped is told on the event stream, with
	// the pause's reason; the others are not (one a second would flood it).
	evs, err := events.List(ctx, js, protocol.EventScheduleSkipped, 0)
	if err != nil {
		t.Fatal(err)
	}
	skipped := 0
	for _, ev := range evs {
		if ev.Reason == "paused" && ev.Data["schedule"] == "p" && ev.Data["pause_reason"] == "deploy freeze" {
			skipped++
		}
	}
	if skipped != 1 {
		t.Fatalf("%d schedule_skipped events with reason paused for the 3 or more ticks skipped, want 1: %+v", skipped, evs)
	}
	if again, changed, err := st.Pause(ctx, "p", "other"); err != nil || changed || again.PauseReason != "deploy freeze" || !again.PausedAt.Equal(e.PausedAt) {
		t.Fatalf("second pause: %+v changed %v, %v; want the first pause left as it was", again, changed, err)
	}

	resumed := time.Now()
	e, changed, err = st.Resume(ctx, "p")
	if err != nil || !changed || e.Paused || e.PauseReason != "" || !e.PausedAt.IsZero() {
		t.Fatalf("resume: %+v changed %v, %v", e, changed, err)
	}
	if !e.Next.After(resumed) || e.Next.After(resumed.Add(time.Second)) {
		t.Fatalf("resumed at %s, next tick %s: want the first whole second after", resumed.Format(time.RFC3339Nano), e.Next.Format(time.RFC3339Nano))
	}
	natstest.Eventually(t, 20*time.Second, "2 ticks after the resume", func() bool {
		return len(ticksIn(got.ticks("p"), resumed, time.Now().Add(time.Hour))) >= 2
	})
	ticks := got.ticks("p")
	if caught := ticksIn(ticks, paused, resumed); len(caught) > 0 {
		t.Fatalf("ticks %v of the pause were run after the resume (catch-up)", caught)
	}
	if after := ticksIn(ticks, resumed, time.Now().Add(time.Hour)); after[0] != e.Next.Unix() || !consecutive(after) {
		t.Fatalf("ticks after the resume %v: want one per second from %d", after, e.Next.Unix())
	}
	if d := got.dups(); len(d) > 0 {
		t.Fatalf("jobs submitted twice: %v", d)
	}
	if _, changed, err := st.Resume(ctx, "p"); err != nil || changed {
		t.Fatalf("resume of a running schedule: changed %v, %v", changed, err)
	}
	t.Logf("paused at %s, resumed at %s, next %s: ticks %v", paused.Format(time.StampMilli), resumed.Format(time.StampMilli), e.Next.Format(time.StampMilli), ticks)
}

// TestPauseSurvivesRelayRestart: a schedule paused, then every relay
// stopped long enough for its tick to be overdue (catchup run_once would
// run it), then a relay started again (it reconciles the timers): the
// pause holds, the overdue tick is not run, nor any later one.
func TestPauseSurvivesRelayRestart(t *testing.T) {
	t.Parallel()
	srv, _, js := natstest.Start(t, streams.Options{})
	got := collect(t, js)
	st := addSchedule(t, js, schedule.Definition{Name: "r", Schedule: "@every 1s", Catchup: schedule.CatchupRunOnce,
		Grace: protocol.Duration(500 * time.Millisecond), Spec: everySecond})
	a := startRelay(t, srv)
	natstest.Eventually(t, 20*time.Second, "a tick submitted", func() bool { return len(got.ticks("r")) >= 1 })
	ctx := context.Background()
	if _, _, err := st.Pause(ctx, "r", ""); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	a.Stop()
	stopped := time.Now()
	natstest.Eventually(t, 10*time.Second, "a tick fired with no relay running", func() bool {
		e, err := st.Get(ctx, "r")
		return err == nil && e.LastTick.After(stopped)
	})
	natstest.Eventually(t, 10*time.Second, "that tick is overdue", func() bool { return time.Now().After(stopped.Add(2 * time.Second)) })
	restarted := time.Now()
	startRelay(t, srv)
	natstest.Eventually(t, 20*time.Second, "3 ticks relayed after the restart", func() bool {
		return handledThrough(t, js, st, "r", restarted.Add(3*time.Second))
	})
	if during := ticksIn(got.ticks("r"), paused, time.Now()); len(during) > 0 {
		t.Fatalf("ticks %v submitted while paused, across a restart", during)
	}
	if e, err := st.Get(ctx, "r"); err != nil || !e.Paused {
		t.Fatalf("after the restart: %+v, %v", e, err)
	}
	t.Logf("paused at %s, relay restarted at %s: ticks %v", paused.Format(time.StampMilli), restarted.Format(time.StampMilli), got.ticks("r"))
}

// TestTriggerSubmitsOneJob: triggering a paused schedule submits its job
// once, with an id no tick can have, and leaves the schedule paused at
// the same revision; a second trigger is a second job.
func TestTriggerSubmitsOneJob(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	st := addSchedule(t, js, schedule.Definition{Name: "tr", Schedule: "@every 1h", Spec: everySecond})
	before, _, err := st.Pause(ctx, "tr", "hand run only")
	if err != nil {
		t.Fatal(err)
	}
	job, err := st.Trigger(ctx, "tr")
	if err != nil {
		t.Fatal(err)
	}
	suffix, ok := strings.CutPrefix(job, "tr-t")
	if !ok || !protocol.ValidToken(job) || strings.Trim(suffix, "0123456789") != "" {
		t.Fatalf("trigger job id %q: want tr-t<unix ms>", job)
	}
	submit, err := js.Stream(ctx, protocol.StreamSubmit)
	if err != nil {
		t.Fatal(err)
	}
	info, err := submit.Info(ctx, jetstream.WithSubjectFilter(protocol.SubjectSubmit+".>"))
	if err != nil {
		t.Fatal(err)
	}
	// The stream maps warden.submit.<job> into the job's partition:
	// warden.submit.<p>.<job>.
	var stored string
	for subj, n := range info.State.Subjects {
		if strings.HasSuffix(subj, "."+job) && n == 1 {
			stored = subj
		}
	}
	if len(info.State.Subjects) != 1 || stored == "" {
		t.Fatalf("submissions after one trigger: %v, want one of %s", info.State.Subjects, job)
	}
	m, err := submit.GetLastMsgForSubject(ctx, stored)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(protocol.HeaderJobID) != job || m.Header.Get(protocol.HeaderSchedule) != "tr" || m.Header.Get(protocol.HeaderScheduleTick) != "" || string(m.Data) != everySecond {
		t.Fatalf("submission headers %v, body %q", m.Header, m.Data)
	}
	after, err := st.Get(ctx, "tr")
	if err != nil || !after.Paused || after.Rev != before.Rev {
		t.Fatalf("after the trigger: %+v, %v; want it paused at revision %d", after, err, before.Rev)
	}
	// A second trigger, in a later millisecond, is a second job.
	firstMs, err := strconv.ParseInt(suffix, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "the clock passed the first trigger's millisecond", func() bool {
		return time.Now().UnixMilli() > firstMs+5
	})
	second, err := st.Trigger(ctx, "tr")
	if err != nil || second == job {
		t.Fatalf("second trigger: %q, %v (first %q)", second, err, job)
	}
	if info, err := submit.Info(ctx, jetstream.WithSubjectFilter(protocol.SubjectSubmit+".>")); err != nil || info.State.Msgs != 2 {
		t.Fatalf("submissions after two triggers: %v, %v", info.State.Subjects, err)
	}
	for _, f := range []func() error{
		func() error { _, err := st.Trigger(ctx, "nope"); return err },
		func() error { _, _, err := st.Pause(ctx, "nope", ""); return err },
		func() error { _, _, err := st.Resume(ctx, "nope"); return err },
	} {
		if err := f(); !errors.Is(err, schedule.ErrNotFound) {
			t.Errorf("unknown schedule: %v, want ErrNotFound", err)
		}
	}
	t.Logf("trigger jobs %s, %s", job, second)
}

// A tick's id is <name>-<digits>; a trigger's never ends so, whatever the
// names: schedule "a-t1" cannot tick as a trigger of "a".
func TestTriggerIDNeverATickID(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 24, 3, 0, 0, 123e6, time.UTC)
	for _, name := range []string{"a", "a-t1", "nightly-1", strings.Repeat("x", 100)} {
		id := schedule.TriggerID(name, at)
		if !protocol.ValidToken(id) {
			t.Errorf("TriggerID(%q) = %q is not a valid job id", name, id)
		}
		last := id[strings.LastIndexByte(id, '-')+1:]
		if strings.Trim(last, "0123456789") == "" {
			t.Errorf("TriggerID(%q) = %q ends as a tick id does", name, id)
		}
	}
	if got := schedule.TriggerID("nightly", at); got != "nightly-t1795489200123" {
		t.Errorf("TriggerID = %q", got)
	}
}

// A definition as stored before pausing existed (no pause fields) reads
// as not paused, and a schedule that is not paused is stored without
// them, as before.
func TestDefinitionWithoutPauseIsNotPaused(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	if err := streams.EnsureWorkflow(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	old := `{"name":"old","schedule":"@every 1h","catchup":"run_once","spec":` + jsonString(everySecond) + `,"created_at":"2026-01-01T00:00:00Z"}`
	if _, err := js.Publish(ctx, protocol.ScheduleDefSubject("old"), []byte(old)); err != nil {
		t.Fatal(err)
	}
	st, err := schedule.NewStore(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	e, err := st.Get(ctx, "old")
	if err != nil || e.Paused || e.PauseReason != "" || !e.PausedAt.IsZero() {
		t.Fatalf("old definition: %+v, %v", e, err)
	}
	b, err := json.Marshal(e.Definition)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"paused", "pause_reason", "paused_at"} {
		if strings.Contains(string(b), `"`+k+`"`) {
			t.Errorf("a schedule not paused is stored with %q: %s", k, b)
		}
	}
	// And it pauses and resumes as any other.
	if _, changed, err := st.Pause(ctx, "old", "x"); err != nil || !changed {
		t.Fatalf("pause: %v %v", changed, err)
	}
	if e, changed, err := st.Resume(ctx, "old"); err != nil || !changed || e.Next.IsZero() {
		t.Fatalf("resume: %+v %v %v", e, changed, err)
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestReplaceKeepsPause: `schedule add --replace` of a paused schedule
// changes its definition and leaves it paused, with its reason.
func TestReplaceKeepsPause(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	st := addSchedule(t, js, schedule.Definition{Name: "rp", Schedule: "@every 1h", Spec: everySecond})
	if _, _, err := st.Pause(ctx, "rp", "incident 42"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Add(ctx, schedule.Definition{Name: "rp", Schedule: "@every 2h", Spec: everySecond}, true); err != nil {
		t.Fatal(err)
	}
	e, err := st.Get(ctx, "rp")
	if err != nil || e.Schedule != "@every 2h" || !e.Paused || e.PauseReason != "incident 42" {
		t.Fatalf("replaced: %+v, %v; want the new expression, still paused", e, err)
	}
}

// TestConcurrentPausesOneWins: pauses racing on one schedule are written
// on the condition that the definition read is still the last: one
// pauses it, every other finds it paused, and its reason is the winner's.
func TestConcurrentPausesOneWins(t *testing.T) {
	t.Parallel()
	srv, _, js := natstest.Start(t, streams.Options{})
	st := addSchedule(t, js, schedule.Definition{Name: "cp", Schedule: "@every 1h", Spec: everySecond})
	const n = 8
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []string
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, cjs := srv.Connect(t)
			cst, err := schedule.NewStore(context.Background(), cjs)
			if err != nil {
				t.Error(err)
				return
			}
			reason := string(rune('a' + i))
			_, changed, err := cst.Pause(context.Background(), "cp", reason)
			if err != nil {
				t.Error(err)
				return
			}
			if changed {
				mu.Lock()
				winners = append(winners, reason)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	e, err := st.Get(context.Background(), "cp")
	if err != nil || len(winners) != 1 || e.PauseReason != winners[0] {
		t.Fatalf("%d concurrent pauses: winners %v, stored reason %q (%v); want one winner, its reason stored", n, winners, e.PauseReason, err)
	}
}

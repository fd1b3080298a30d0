package health_test

import (
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/pkg/protocol"
)

// agentSim produces the heartbeats of one agent.
type agentSim struct {
	p protocol.Presence
}

func newAgentSim(id string) *agentSim {
	return &agentSim{p: protocol.Presence{ID: id, Pool: "p", MaxConcurrent: 4, StartedAt: t0, HeartbeatAt: t0}}
}

// beat advances the agent's clock by gap, adds outcomes and returns the
// heartbeat.
func (a *agentSim) beat(gap time.Duration, succeeded, failed uint64) protocol.Presence {
	a.p.HeartbeatAt = a.p.HeartbeatAt.Add(gap)
	a.p.Succeeded += succeeded
	a.p.Failed += failed
	return a.p
}

func tracker(t *testing.T, edit func(*health.Config)) *health.Tracker {
	t.Helper()
	cfg := health.DefaultConfig()
	if edit != nil {
		edit(&cfg)
	}
	tr, err := health.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestTrackerRates(t *testing.T) {
	t.Parallel()
	tr := tracker(t, func(c *health.Config) { c.Window = protocol.Duration(10 * time.Second) })
	a := newAgentSim("a")
	a.p.Succeeded, a.p.Failed = 1000, 1000 // history before the tracker saw it: not counted
	now := t0
	tr.Heartbeat(a.p, now)
	key := protocol.PresenceKey("p", "a")
	for i := 0; i < 20; i++ { // 20 beats, one per second: 2 successes and 1 failure each
		now = now.Add(time.Second)
		tr.Heartbeat(a.beat(time.Second, 2, 1), now)
	}
	o, ok := tr.Observation(key, now)
	if !ok {
		t.Fatal("agent not tracked")
	}
	// The 10s window holds the last 10 beats (those received after now-10s).
	if o.Succeeded != 20 || o.Failed != 10 || len(o.HeartbeatGaps) != 10 {
		t.Fatalf("window: %d succeeded, %d failed, %d gaps; want 20, 10, 10", o.Succeeded, o.Failed, len(o.HeartbeatGaps))
	}
	if o.ConsecutiveFailures != 0 {
		t.Fatalf("consecutive failures %d, want 0 (successes in every interval)", o.ConsecutiveFailures)
	}
	as, _ := tr.Assess(key, now)
	if as.Level != health.Degraded || as.SuccessRate == nil || *as.SuccessRate < 0.66 || *as.SuccessRate > 0.67 {
		t.Fatalf("assessment %+v, want degraded (failure rate 33%%) with success rate 2/3", as)
	}
	// A duplicate or older heartbeat changes nothing.
	tr.Heartbeat(a.p, now)
	if o2, _ := tr.Observation(key, now); o2.Succeeded != o.Succeeded || len(o2.HeartbeatGaps) != len(o.HeartbeatGaps) {
		t.Fatalf("duplicate heartbeat counted: %+v", o2)
	}
}

func TestTrackerConsecutiveFailures(t *testing.T) {
	t.Parallel()
	tr := tracker(t, func(c *health.Config) { c.MinTasks = 1000 }) // rates out of the way
	a := newAgentSim("a")
	key := protocol.PresenceKey("p", "a")
	now := t0
	tr.Heartbeat(a.p, now)
	step := func(s, f uint64) health.Assessment {
		now = now.Add(time.Second)
		tr.Heartbeat(a.beat(time.Second, s, f), now)
		as, _ := tr.Assess(key, now)
		return as
	}
	if as := step(0, 2); as.Level != health.Healthy {
		t.Fatalf("2 failures: %s %q", as.Level, as.Reasons)
	}
	if as := step(0, 1); as.Level != health.Degraded {
		t.Fatalf("3 consecutive failures: %s %q", as.Level, as.Reasons)
	}
	if as := step(1, 4); as.Level == health.Critical {
		t.Fatalf("a success among failures must reset the estimate: %q", as.Reasons)
	}
	step(0, 5)
	if as := step(0, 5); as.Level != health.Critical {
		t.Fatalf("10 consecutive failures: %s %q", as.Level, as.Reasons)
	}
	if o, _ := tr.Observation(key, now); o.ConsecutiveFailures != 10 {
		t.Fatalf("consecutive failures %d, want 10", o.ConsecutiveFailures)
	}
}

func TestTrackerHeartbeats(t *testing.T) {
	t.Parallel()
	tr := tracker(t, nil)
	a := newAgentSim("a")
	key := protocol.PresenceKey("p", "a")
	now := t0
	tr.Heartbeat(a.p, now)
	for range 30 {
		now = now.Add(time.Second)
		tr.Heartbeat(a.beat(time.Second, 1, 0), now)
	}
	if as, _ := tr.Assess(key, now); as.Level != health.Healthy || as.Score != 1 {
		t.Fatalf("regular agent: %+v", as)
	}
	// Silence: regularity drops while the gap grows, then the timeout fails it.
	if as, _ := tr.Assess(key, now.Add(3*time.Second)); as.Components[health.ComponentHeartbeatRegularity] >= 1 {
		t.Fatalf("3s silence did not lower regularity: %+v", as)
	}
	if as, _ := tr.Assess(key, now.Add(6*time.Second)); as.Level != health.Failed {
		t.Fatalf("6s silence: %+v", as)
	}
	// Ten 4s gaps among 30 regular ones: regularity (30 + 10×0.375)/40.
	for range 10 {
		now = now.Add(4 * time.Second)
		tr.Heartbeat(a.beat(4*time.Second, 1, 0), now)
	}
	as, _ := tr.Assess(key, now)
	if r := as.Components[health.ComponentHeartbeatRegularity]; r < 0.84 || r > 0.85 {
		t.Fatalf("regularity %.3f, want ~0.844", r)
	}
}

func TestTrackerRestartAndQueue(t *testing.T) {
	t.Parallel()
	tr := tracker(t, nil)
	a := newAgentSim("a")
	key := protocol.PresenceKey("p", "a")
	now := t0
	tr.Heartbeat(a.p, now)
	now = now.Add(time.Second)
	tr.Heartbeat(a.beat(time.Second, 10, 0), now)
	// Restart: counters start again from zero with a new started_at.
	a.p.StartedAt, a.p.Succeeded, a.p.Failed = now, 0, 0
	now = now.Add(time.Second)
	tr.Heartbeat(a.beat(time.Second, 3, 1), now)
	o, _ := tr.Observation(key, now)
	if o.Succeeded != 13 || o.Failed != 1 {
		t.Fatalf("after restart: %d succeeded, %d failed; want 13, 1", o.Succeeded, o.Failed)
	}
	tr.SetQueueDepth(key, 120)
	tr.SetReported(key, health.Known(0.9), nil)
	o, _ = tr.Observation(key, now)
	if o.QueueDepth != 120 || o.SelfReported == nil {
		t.Fatalf("queue/self: %+v", o)
	}
	if as, _ := tr.Assess(key, now); as.Level != health.Critical {
		t.Fatalf("queue 120: %+v", as)
	}
	if all := tr.AssessAll(now); len(all) != 1 {
		t.Fatalf("AssessAll: %v", all)
	}
	tr.Forget(key)
	if _, ok := tr.Assess(key, now); ok || len(tr.Keys()) != 0 {
		t.Fatal("forgotten agent still tracked")
	}
	tr.SetQueueDepth(key, 1) // unknown agents are ignored
	if len(tr.Keys()) != 0 {
		t.Fatal("unknown agent created")
	}
}

// TestTrackerUsesReportedFactors: the five factors an agent's heartbeat
// feeds the assessment: queue depth (a hard threshold), self-reported
// health and utilisation (components), and its own heartbeat interval
// (regularity is judged against it, not the config's), with heartbeat age
// and the completion and error rates from its counters as before.
func TestTrackerUsesReportedFactors(t *testing.T) {
	t.Parallel()
	tr := tracker(t, nil) // config interval 1s
	a := newAgentSim("a")
	a.p.HeartbeatInterval = protocol.Duration(2 * time.Second)
	a.p.QueueDepth = 120
	a.p.Health = health.Known(0.2)
	a.p.Utilisation = health.Known(0.95)
	now := t0
	tr.Heartbeat(a.p, now)
	for range 6 {
		now = now.Add(2 * time.Second)
		tr.Heartbeat(a.beat(2*time.Second, 1, 0), now)
	}
	key := protocol.PresenceKey("p", "a")
	o, _ := tr.Observation(key, now)
	if o.QueueDepth != 120 || o.SelfReported == nil || *o.SelfReported != 0.2 || o.Utilisation == nil ||
		*o.Utilisation != 0.95 || o.ExpectedInterval != 2*time.Second {
		t.Fatalf("observation %+v: want queue 120, self 0.2, utilisation 0.95, interval 2s", o)
	}
	as, _ := tr.Assess(key, now)
	c := as.Components
	if c[health.ComponentHeartbeatRegularity] != 1 {
		t.Errorf("regularity %.2f: 2s gaps at a 2s interval are regular", c[health.ComponentHeartbeatRegularity])
	}
	if c[health.ComponentSelfReported] != 0.2 || c[health.ComponentResourceUtilisation] < 0.249 ||
		c[health.ComponentResourceUtilisation] > 0.251 {
		t.Errorf("components %v: want self_reported 0.2, resource_utilisation 0.25", c)
	}
	if as.Level != health.Critical || len(as.Reasons) == 0 || as.Reasons[0] != "queue depth 120 ≥ 100 (critical)" {
		t.Errorf("level %s, reasons %q: want critical for the queue depth first", as.Level, as.Reasons)
	}

	// The agent recovers: the next heartbeats say so.
	a.p.QueueDepth, a.p.Health, a.p.Utilisation = 0, health.Known(1), health.Known(0.1)
	for range 3 {
		now = now.Add(2 * time.Second)
		tr.Heartbeat(a.beat(2*time.Second, 1, 0), now)
	}
	as, _ = tr.Assess(key, now)
	if as.Level != health.Healthy {
		t.Errorf("after recovery: %s %q", as.Level, as.Reasons)
	}
}

// TestTrackerStreakDecays: an agent drained for 10 consecutive failures gets
// no task, so it never records the success that would end its streak. Once
// the streak is a window old it must be selectable again (probation:
// degraded), not critical forever; a failure on probation trips it again at
// once, and a success clears it.
func TestTrackerStreakDecays(t *testing.T) {
	t.Parallel()
	tr := tracker(t, nil) // window 5m, heartbeats every 1s, min_tasks 5
	window := tr.Assessor().Config().Window.Std()
	a := newAgentSim("a")
	key := protocol.PresenceKey("p", "a")
	now := t0
	tr.Heartbeat(a.p, now)
	beat := func(s, f uint64) health.Assessment {
		now = now.Add(time.Second)
		tr.Heartbeat(a.beat(time.Second, s, f), now)
		as, _ := tr.Assess(key, now)
		return as
	}
	for range 10 { // a downstream outage: every task fails
		beat(0, 1)
	}
	if as, _ := tr.Assess(key, now); as.Level != health.Critical {
		t.Fatalf("10 consecutive failures: %s %q, want critical", as.Level, as.Reasons)
	}
	lastFailure := now

	// Drained: heartbeats only. The streak holds for the window...
	for now.Before(lastFailure.Add(window - time.Second)) {
		if as := beat(0, 0); as.Level != health.Critical {
			t.Fatalf("%s after the last failure: %s %q, want still critical", now.Sub(lastFailure), as.Level, as.Reasons)
		}
	}
	// ...and no longer once it is a window old.
	for range 2 {
		beat(0, 0)
	}
	as, _ := tr.Assess(key, now)
	if as.Level == health.Critical || as.Level == health.Failed {
		t.Fatalf("%s after the last failure (window %s), no task since: %s %q, want selectable again",
			now.Sub(lastFailure), window, as.Level, as.Reasons)
	}
	if as.Level != health.Degraded || len(as.Reasons) == 0 || !strings.Contains(as.Reasons[0], "on probation") {
		t.Fatalf("stale streak: %s %q, want degraded on probation", as.Level, as.Reasons)
	}
	if o, _ := tr.Observation(key, now); o.ConsecutiveFailures != 10 || !o.LastFailure.Equal(lastFailure) {
		t.Fatalf("observation: %d consecutive failures, last %s; want 10, %s", o.ConsecutiveFailures, o.LastFailure, lastFailure)
	}

	// Tried again and still failing: critical after one task.
	if as := beat(0, 1); as.Level != health.Critical {
		t.Fatalf("failure on probation: %s %q, want critical again", as.Level, as.Reasons)
	}
	// A quiet window later it is on probation again; a success ends it.
	for range int(window/time.Second) + 1 {
		beat(0, 0)
	}
	if as, _ := tr.Assess(key, now); as.Level != health.Degraded {
		t.Fatalf("second quiet window: %s %q, want degraded", as.Level, as.Reasons)
	}
	if as := beat(1, 0); as.Level != health.Healthy {
		t.Fatalf("success on probation: %s %q, want healthy", as.Level, as.Reasons)
	}
}

// TestTrackerRestartEndsStreak: a restarted agent starts a new streak.
func TestTrackerRestartEndsStreak(t *testing.T) {
	t.Parallel()
	tr := tracker(t, func(c *health.Config) { c.MinTasks = 1000 })
	a := newAgentSim("a")
	key := protocol.PresenceKey("p", "a")
	now := t0
	tr.Heartbeat(a.p, now)
	now = now.Add(time.Second)
	tr.Heartbeat(a.beat(time.Second, 0, 10), now)
	a.p.StartedAt, a.p.Succeeded, a.p.Failed = now, 0, 0
	now = now.Add(time.Second)
	tr.Heartbeat(a.beat(time.Second, 0, 0), now)
	if o, _ := tr.Observation(key, now); o.ConsecutiveFailures != 0 || !o.LastFailure.IsZero() {
		t.Fatalf("after restart: %d consecutive failures, last %s; want none", o.ConsecutiveFailures, o.LastFailure)
	}
}

// An agent whose clock steps back (an NTP correction) keeps heartbeating:
// its records arrive in order, stamped earlier than the last. They were
// ignored until its clock passed the old stamp again, so the agent looked
// silent and was failed over while it ran.
//
// Old code: "a live agent whose clock stepped back an hour is failed
// (heartbeat last received 10s ago)".
func TestTrackerTakesHeartbeatsAfterTheAgentsClockSteppedBack(t *testing.T) {
	t.Parallel()
	tr := tracker(t, nil)
	a := newAgentSim("a")
	key := protocol.PresenceKey("p", "a")
	now := t0
	for range 5 {
		now = now.Add(time.Second)
		tr.Heartbeat(a.beat(time.Second, 1, 0), now)
	}
	a.p.HeartbeatAt = a.p.HeartbeatAt.Add(-time.Hour)
	for range 10 {
		now = now.Add(time.Second)
		tr.Heartbeat(a.beat(time.Second, 1, 0), now)
	}
	as, _ := tr.Assess(key, now)
	o, _ := tr.Observation(key, now)
	if as.Level != health.Healthy {
		t.Fatalf("a live agent whose clock stepped back an hour is %s (heartbeat last received %s ago): %v",
			as.Level, now.Sub(o.LastHeartbeat), as.Reasons)
	}
	for _, g := range o.HeartbeatGaps {
		if g <= 0 || g > time.Second {
			t.Fatalf("gaps %v: the step back counted as a gap", o.HeartbeatGaps)
		}
	}
	if o.Succeeded != 14 { // the first heartbeat is the baseline
		t.Fatalf("%d successes in the window, want 14", o.Succeeded)
	}
}

// An older heartbeat of the same process (its counters lower than the
// last one's) is ignored: the leader's seed reads a snapshot of the view
// that can be older than a heartbeat the watch brought meanwhile. Taken
// for a restart (after the clock-step change), it counted the agent's
// lifetime totals in the window. (A review of that change.)
//
// Old code (0a3dfe6): "window holds 400 failures, 100 successes; level
// failed [failure rate 80% ≥ 70% …]".
func TestTrackerIgnoresAnOlderHeartbeatOfTheSameProcess(t *testing.T) {
	t.Parallel()
	tr := tracker(t, nil)
	a := newAgentSim("a")
	a.p.Succeeded, a.p.Failed = 100, 400 // a long life before this leader
	key := protocol.PresenceKey("p", "a")
	now := t0
	older := a.beat(time.Second, 0, 0)
	newer := a.beat(time.Second, 10, 0)
	tr.Heartbeat(newer, now)
	now = now.Add(100 * time.Millisecond)
	tr.Heartbeat(older, now)
	o, _ := tr.Observation(key, now)
	as, _ := tr.Assess(key, now)
	if o.Failed != 0 || as.Level != health.Healthy {
		t.Fatalf("window holds %d failures, %d successes; level %s %v", o.Failed, o.Succeeded, as.Level, as.Reasons)
	}
}

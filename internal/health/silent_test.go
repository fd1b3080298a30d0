package health_test

import (
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/health"
)

// Silent says the heartbeat timeout alone made an agent failed, Overdue
// that its next heartbeat is late: the supervisor does not fail over a
// silent agent while most of its pool is overdue too.
func TestSilentAndOverdueHeartbeats(t *testing.T) {
	t.Parallel()
	a := assessor(t, nil)
	cases := []struct {
		name    string
		edit    func(*health.Observation)
		level   health.Level
		silent  bool
		overdue bool
	}{
		{name: "heartbeating", edit: func(*health.Observation) {}, level: health.Healthy},
		{name: "a heartbeat late", edit: func(o *health.Observation) {
			o.LastHeartbeat = t0.Add(-2 * time.Second)
		}, level: health.Healthy, overdue: true},
		{name: "a heartbeat late for its own interval", edit: func(o *health.Observation) {
			o.LastHeartbeat, o.ExpectedInterval = t0.Add(-2*time.Second), 4*time.Second
		}, level: health.Healthy},
		{name: "silent, otherwise healthy", edit: func(o *health.Observation) {
			o.LastHeartbeat = t0.Add(-6 * time.Second)
		}, level: health.Failed, silent: true, overdue: true},
		{name: "silent, otherwise critical", edit: func(o *health.Observation) {
			o.LastHeartbeat, o.ConsecutiveFailures, o.LastFailure = t0.Add(-6*time.Second), 12, t0.Add(-time.Second)
		}, level: health.Failed, silent: true, overdue: true},
		{name: "silent and failed anyway", edit: func(o *health.Observation) {
			o.LastHeartbeat, o.SelfReported, o.Utilisation = t0.Add(-6*time.Second), health.Known(0), health.Known(1)
			o.Failed, o.Lost, o.HeartbeatGaps = 20, 20, gaps(60, 10*time.Second)
		}, level: health.Failed, overdue: true},
		{name: "failed while heartbeating", edit: func(o *health.Observation) {
			o.SelfReported, o.Utilisation, o.Failed, o.Lost = health.Known(0), health.Known(1), 20, 20
			o.HeartbeatGaps = gaps(60, 10*time.Second)
		}, level: health.Failed},
	}
	for _, c := range cases {
		o := steady()
		c.edit(&o)
		as := a.Assess(o)
		if as.Level != c.level || as.Silent != c.silent || as.Overdue != c.overdue {
			t.Errorf("%s: %s silent=%v overdue=%v (score %.2f, %v), want %s silent=%v overdue=%v",
				c.name, as.Level, as.Silent, as.Overdue, as.Score, as.Reasons, c.level, c.silent, c.overdue)
		}
	}
}

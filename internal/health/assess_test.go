package health_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/health"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func assessor(t *testing.T, edit func(*health.Config)) *health.Assessor {
	t.Helper()
	cfg := health.DefaultConfig()
	if edit != nil {
		edit(&cfg)
	}
	a, err := health.NewAssessor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// gaps returns n heartbeat gaps of d.
func gaps(n int, d time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

// steady is a well-behaved agent: regular heartbeats, the last one just now.
func steady() health.Observation {
	return health.Observation{
		Now: t0, LastHeartbeat: t0.Add(-200 * time.Millisecond),
		HeartbeatGaps: gaps(60, time.Second), MaxConcurrent: 4,
	}
}

func TestAssessLevels(t *testing.T) {
	t.Parallel()
	a := assessor(t, nil)
	cases := []struct {
		name   string
		edit   func(*health.Observation)
		score  float64 // <0: not checked
		level  health.Level
		reason string // substring of one reason
	}{
		{name: "no data at all", edit: func(o *health.Observation) { *o = health.Observation{Now: t0} }, score: 1, level: health.Healthy},
		{name: "steady idle", edit: func(*health.Observation) {}, score: 1, level: health.Healthy},
		{name: "steady busy and successful", edit: func(o *health.Observation) {
			o.Succeeded, o.InFlight = 200, 4
		}, score: 1, level: health.Healthy},
		{name: "all components known and perfect", edit: func(o *health.Observation) {
			o.SelfReported, o.Utilisation, o.Succeeded = health.Known(1), health.Known(0.5), 10
		}, score: 1, level: health.Healthy},
		// Every component at 0.8: self 0.8, regularity 0.8 (gaps of
		// 1.875s), completion and error 0.8, utilisation 0.84 → 0.8 × 0.85 +
		// 0.15 × ... = degraded.
		{name: "everything a bit off", edit: func(o *health.Observation) {
			o.SelfReported = health.Known(0.8)
			o.HeartbeatGaps = gaps(10, 1875*time.Millisecond)
			o.Succeeded, o.Failed = 8, 2
			o.Utilisation = health.Known(0.84)
		}, score: 0.8, level: health.Degraded, reason: "heartbeat_regularity 0.80"},
		{name: "self report 0.5 only", edit: func(o *health.Observation) {
			o.SelfReported = health.Known(0.5) // (0.2×0.5 + 0.3×1) / 0.5
		}, score: 0.8, level: health.Degraded, reason: "self_reported 0.50"},
		{name: "irregular heartbeats", edit: func(o *health.Observation) {
			o.HeartbeatGaps = gaps(10, 3*time.Second) // each 0.5
		}, score: 0.5, level: health.Warning, reason: "heartbeats arrive late"},
		{name: "saturated resources and late", edit: func(o *health.Observation) {
			o.HeartbeatGaps = gaps(10, 5*time.Second) // 0.3 each
			o.Utilisation = health.Known(1)           // 0
			o.SelfReported = health.Known(0.2)
		}, score: (0.3*0.3 + 0 + 0.2*0.2) / 0.65, level: health.Failed},
		{name: "late open gap counts", edit: func(o *health.Observation) {
			o.HeartbeatGaps = nil
			o.LastHeartbeat = t0.Add(-3 * time.Second) // 0.5, not yet timed out
		}, score: 0.5, level: health.Warning},
		{name: "silent past timeout", edit: func(o *health.Observation) {
			o.LastHeartbeat = t0.Add(-6 * time.Second)
		}, score: -1, level: health.Failed, reason: "no heartbeat for 6s"},
		{name: "3 consecutive failures", edit: func(o *health.Observation) {
			o.ConsecutiveFailures = 3
		}, score: 1, level: health.Degraded, reason: "consecutive failures 3 ≥ 3 (degraded)"},
		{name: "10 consecutive failures", edit: func(o *health.Observation) {
			o.ConsecutiveFailures = 10
		}, score: 1, level: health.Critical, reason: "consecutive failures 10 ≥ 10 (critical)"},
		{name: "queue 49", edit: func(o *health.Observation) { o.QueueDepth = 49 }, score: 1, level: health.Healthy},
		{name: "queue 50", edit: func(o *health.Observation) { o.QueueDepth = 50 }, score: 1, level: health.Degraded, reason: "queue depth 50 ≥ 50"},
		{name: "queue 100", edit: func(o *health.Observation) { o.QueueDepth = 100 }, score: 1, level: health.Critical, reason: "queue depth 100 ≥ 100"},
		{name: "failure rate 20%", edit: func(o *health.Observation) {
			o.Succeeded, o.Failed = 80, 20 // completion 0.8, error 0.8: (0.3+0.2+0.08)/0.65
		}, score: 0.58 / 0.65, level: health.Degraded, reason: "task_completion 0.80"},
		{name: "failure rate 30%", edit: func(o *health.Observation) {
			o.Succeeded, o.Failed = 70, 30
		}, score: -1, level: health.Degraded, reason: "failure rate 30% ≥ 30% over 100 tasks (degraded)"},
		{name: "failure rate 70% with lost tasks", edit: func(o *health.Observation) {
			o.Succeeded, o.Failed, o.Lost = 30, 40, 30
		}, score: -1, level: health.Critical, reason: "failure rate 70% ≥ 70%"},
		{name: "too few tasks for rates", edit: func(o *health.Observation) {
			o.Succeeded, o.Failed = 0, 4
		}, score: 1, level: health.Healthy},
		{name: "worst threshold wins", edit: func(o *health.Observation) {
			o.QueueDepth, o.ConsecutiveFailures = 60, 12
		}, score: 1, level: health.Critical, reason: "queue depth 60 ≥ 50 (degraded)"},
		{name: "threshold does not raise a worse score", edit: func(o *health.Observation) {
			o.HeartbeatGaps = gaps(10, 5*time.Second)
			o.SelfReported = health.Known(0)
			o.QueueDepth = 50
		}, score: -1, level: health.Failed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			o := steady()
			c.edit(&o)
			got := a.Assess(o)
			if c.score >= 0 && math.Abs(got.Score-c.score) > 1e-6 {
				t.Errorf("score %.6f, want %.6f (components %v)", got.Score, c.score, got.Components)
			}
			if got.Level != c.level {
				t.Errorf("level %s, want %s (score %.3f, reasons %q)", got.Level, c.level, got.Score, got.Reasons)
			}
			if c.reason != "" && !containsReason(got.Reasons, c.reason) {
				t.Errorf("reasons %q, want one containing %q", got.Reasons, c.reason)
			}
			if got.Level == health.Healthy && len(got.Reasons) > 0 {
				t.Errorf("healthy with reasons %q", got.Reasons)
			}
			if !got.AssessedAt.Equal(t0) {
				t.Errorf("assessed_at %s, want now", got.AssessedAt)
			}
		})
	}
}

func containsReason(reasons []string, s string) bool {
	for _, r := range reasons {
		if strings.Contains(r, s) {
			return true
		}
	}
	return false
}

// TestScoreBoundaries checks each level's least score with only the
// self-reported component known.
func TestScoreBoundaries(t *testing.T) {
	t.Parallel()
	a := assessor(t, func(c *health.Config) {
		c.Weights = health.Weights{SelfReported: 1}
	})
	cases := []struct {
		v    float64
		want health.Level
	}{
		{1, health.Healthy}, {0.9, health.Healthy}, {0.8999, health.Degraded}, {0.7, health.Degraded},
		{0.69, health.Warning}, {0.5, health.Warning}, {0.49, health.Critical}, {0.3, health.Critical},
		{0.29, health.Failed}, {0, health.Failed}, {-3, health.Failed}, {7, health.Healthy},
	}
	for _, c := range cases {
		got := a.Assess(health.Observation{Now: t0, SelfReported: health.Known(c.v)})
		if got.Level != c.want {
			t.Errorf("self_reported %g: level %s, want %s", c.v, got.Level, c.want)
		}
	}
}

func TestWeightsAndUnhealthyLevel(t *testing.T) {
	t.Parallel()
	// Without the regularity weight, late heartbeats do not count.
	a := assessor(t, func(c *health.Config) {
		c.Weights.HeartbeatRegularity = 0
		c.Thresholds.UnhealthyLevel = health.Failed
	})
	o := steady()
	o.HeartbeatGaps = gaps(10, 10*time.Second)
	o.LastHeartbeat = t0
	if got := a.Assess(o); got.Level != health.Healthy {
		t.Errorf("regularity weight 0: %s %v", got.Level, got.Reasons)
	}
	o.ConsecutiveFailures = 10
	if got := a.Assess(o); got.Level != health.Failed {
		t.Errorf("unhealthy_level failed: %s", got.Level)
	}
}

func TestSuccessRate(t *testing.T) {
	t.Parallel()
	a := assessor(t, nil)
	o := steady()
	o.Succeeded, o.Failed, o.Lost = 3, 0, 0
	if got := a.Assess(o); got.SuccessRate != nil {
		t.Errorf("3 tasks: success rate %v, want none below min_tasks", *got.SuccessRate)
	}
	o.Succeeded, o.Failed, o.Lost = 18, 1, 1
	if got := a.Assess(o); got.SuccessRate == nil || *got.SuccessRate != 0.9 {
		t.Errorf("18 of 20: success rate %v, want 0.9", got.SuccessRate)
	}
}

// TestAssessStaleStreak: a streak counts in full while its latest failure
// is less than a window old (or its time is not known), and caps the level
// at degraded at worst from a window on.
func TestAssessStaleStreak(t *testing.T) {
	t.Parallel()
	a := assessor(t, nil) // window 5m
	window := a.Config().Window.Std()
	cases := []struct {
		name   string
		streak int
		ago    time.Duration // <0: LastFailure not known
		level  health.Level
		reason string
	}{
		{name: "recent", streak: 10, ago: window - time.Millisecond, level: health.Critical, reason: "consecutive failures 10 ≥ 10 (critical)"},
		{name: "time not known", streak: 10, ago: -1, level: health.Critical, reason: "consecutive failures 10 ≥ 10 (critical)"},
		{name: "a window old", streak: 10, ago: window, level: health.Degraded, reason: "on probation until a success (degraded)"},
		{name: "long ago", streak: 50, ago: 24 * time.Hour, level: health.Degraded, reason: "on probation"},
		{name: "short and stale", streak: 2, ago: window, level: health.Healthy},
		{name: "degraded and stale", streak: 4, ago: window, level: health.Degraded, reason: "on probation"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			o := steady()
			o.ConsecutiveFailures = c.streak
			if c.ago >= 0 {
				o.LastFailure = o.Now.Add(-c.ago)
			}
			as := a.Assess(o)
			if as.Level != c.level {
				t.Fatalf("level %s, reasons %q; want %s", as.Level, as.Reasons, c.level)
			}
			if c.reason == "" {
				if len(as.Reasons) != 0 {
					t.Fatalf("reasons %q, want none", as.Reasons)
				}
				return
			}
			if len(as.Reasons) == 0 || !strings.Contains(as.Reasons[0], c.reason) {
				t.Fatalf("reasons %q, want the first to contain %q", as.Reasons, c.reason)
			}
		})
	}
}

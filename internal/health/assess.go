package health

import (
	"fmt"
	"slices"
	"time"
)

// Component names, as keys of Assessment.Components.
const (
	ComponentSelfReported        = "self_reported"
	ComponentHeartbeatRegularity = "heartbeat_regularity"
	ComponentTaskCompletion      = "task_completion"
	ComponentResourceUtilisation = "resource_utilisation"
	ComponentErrorRate           = "error_rate"
)

// epsilon absorbs float rounding at level boundaries (0.9 stays healthy).
const epsilon = 1e-9

// Observation is what is known of one agent at Now. It is plain data: a
// Tracker builds it from heartbeats, tests write it by hand.
type Observation struct {
	// Now is the time of the assessment.
	Now time.Time
	// LastHeartbeat is when the last heartbeat was received; zero: no
	// heartbeat is known (the timeout does not apply).
	LastHeartbeat time.Time
	// ExpectedInterval is the agent's heartbeat interval; 0: the config's.
	ExpectedInterval time.Duration
	// HeartbeatGaps are the intervals between consecutive heartbeats in the
	// window, oldest first.
	HeartbeatGaps []time.Duration
	// Succeeded, Failed and Lost count tasks finished in the window: with
	// success, with a failure the agent reported, and without any report.
	// The Tracker records no lost tasks (healing's own queue transfers
	// said nothing of the agent); a caller that knows of some sets Lost.
	Succeeded, Failed, Lost int
	// ConsecutiveFailures is the number of failures since the last success.
	ConsecutiveFailures int
	// LastFailure is when the latest of those failures was recorded; zero:
	// not known (the streak counts in full, as if it had just happened). A
	// streak whose latest failure is a window old or more is stale: it
	// caps the level at degraded at worst (see Assess).
	LastFailure time.Time
	// InFlight and MaxConcurrent are the agent's last reported load.
	InFlight, MaxConcurrent int
	// QueueDepth is the number of tasks waiting for the agent.
	QueueDepth int
	// SelfReported is the agent's own health, 0..1; nil: not reported.
	SelfReported *float64
	// Utilisation is the agent's resource utilisation (the busiest of CPU,
	// memory, ...), 0..1; nil: not reported.
	Utilisation *float64
}

// Known returns a pointer to v, for Observation's optional fields.
func Known(v float64) *float64 { return &v }

// Assessment is the health of one agent.
type Assessment struct {
	// Score is the weighted mean of the known components, 0..1.
	Score float64 `json:"score"`
	// Level is the score's level, capped by the hard thresholds.
	Level Level `json:"level"`
	// Reasons say, worst first, what keeps the level below healthy.
	Reasons []string `json:"reasons,omitempty"`
	// Components are the known components' values, by name.
	Components map[string]float64 `json:"components,omitempty"`
	// SuccessRate is succeeded / (succeeded + failed + lost) in the window,
	// nil when fewer than min_tasks finished. Selection prefers it to the
	// agent's lifetime counters.
	SuccessRate *float64 `json:"success_rate,omitempty"`
	// AssessedAt is the Observation's Now.
	AssessedAt time.Time `json:"assessed_at"`
	// Silent is true when the level is failed only because no heartbeat
	// was received for heartbeat_timeout: without that, the agent would be
	// at a better level. It is the verdict a watcher that missed the
	// agent's heartbeats would reach too, so the supervisor does not act
	// on it while most of the agent's pool is Overdue as well.
	Silent bool `json:"silent,omitempty"`
	// Overdue is true when the agent's next heartbeat is late: none was
	// received for longer than its interval × (1 + heartbeat_tolerance).
	Overdue bool `json:"overdue,omitempty"`
}

// Assessor scores observations with a Config.
type Assessor struct{ cfg Config }

// NewAssessor validates cfg and returns an Assessor using it.
func NewAssessor(cfg Config) (*Assessor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Assessor{cfg: cfg}, nil
}

// Config returns the assessor's configuration.
func (a *Assessor) Config() Config { return a.cfg }

type component struct {
	name   string
	weight float64
	value  float64
	why    string // what a low value means
}

// Assess scores o and derives its level.
func (a *Assessor) Assess(o Observation) Assessment {
	cfg := a.cfg
	as := Assessment{AssessedAt: o.Now, Components: map[string]float64{}}
	comps := a.components(o)

	var sum, weights float64
	for _, c := range comps {
		as.Components[c.name] = c.value
		sum += c.weight * c.value
		weights += c.weight
	}
	as.Score = 1
	if weights > 0 {
		as.Score = clamp01(sum / weights)
	}
	as.Level = a.levelOf(as.Score)

	finished := o.Succeeded + o.Failed + o.Lost
	if finished >= cfg.MinTasks {
		as.SuccessRate = Known(float64(o.Succeeded) / float64(finished))
	}

	// Hard thresholds, worst first.
	th := cfg.Thresholds
	type reason struct {
		level Level
		text  string
	}
	var hard []reason
	capAt := func(l Level, format string, args ...any) {
		as.Level = worst(as.Level, l)
		hard = append(hard, reason{l, fmt.Sprintf(format, args...) + " (" + l.String() + ")"})
	}
	timedOut := false
	if !o.LastHeartbeat.IsZero() {
		age := o.Now.Sub(o.LastHeartbeat)
		as.Overdue = age > a.allowedGap(o)
		if age > cfg.HeartbeatTimeout.Std() {
			capAt(Failed, "no heartbeat for %s > heartbeat_timeout %s", age.Round(time.Millisecond), cfg.HeartbeatTimeout)
			timedOut = true
		}
	}
	checkCount := func(name string, v int, l CountLimits) {
		switch {
		case v >= l.Unhealthy:
			capAt(th.UnhealthyLevel, "%s %d ≥ %d", name, v, l.Unhealthy)
		case v >= l.Degraded:
			capAt(Degraded, "%s %d ≥ %d", name, v, l.Degraded)
		}
	}
	// A streak decays once it has stopped for a window. An agent drained for
	// its failures gets no task, so it can never record the success that
	// ends the streak: counted forever, the streak would keep it critical
	// (excluded from selection) long after the cause went away, and a pool
	// that failed as a whole during an outage would never be tried again.
	// So, like the rates, the streak counts only while it is recent; when
	// its latest failure is a window old the agent is on probation: at best
	// degraded (deprioritised but selectable, so the healer undrains it)
	// until a success ends the streak. A failure on probation makes the
	// streak recent again, at its full length: one more failure trips the
	// unhealthy limit again at once, like a half-open circuit breaker.
	if stale := !o.LastFailure.IsZero() && o.Now.Sub(o.LastFailure) >= cfg.Window.Std(); stale {
		if o.ConsecutiveFailures >= th.ConsecutiveFailures.Degraded {
			capAt(Degraded, "consecutive failures %d, the last %s ago ≥ window %s: on probation until a success",
				o.ConsecutiveFailures, o.Now.Sub(o.LastFailure).Round(time.Millisecond), cfg.Window)
		}
	} else {
		checkCount("consecutive failures", o.ConsecutiveFailures, th.ConsecutiveFailures)
	}
	checkCount("queue depth", o.QueueDepth, th.QueueDepth)
	if finished >= cfg.MinTasks {
		rate := float64(o.Failed+o.Lost) / float64(finished)
		switch {
		case rate >= th.FailureRate.Unhealthy-epsilon:
			capAt(th.UnhealthyLevel, "failure rate %s ≥ %s over %d tasks", pct(rate), pct(th.FailureRate.Unhealthy), finished)
		case rate >= th.FailureRate.Degraded-epsilon:
			capAt(Degraded, "failure rate %s ≥ %s over %d tasks", pct(rate), pct(th.FailureRate.Degraded), finished)
		}
	}
	slices.SortStableFunc(hard, func(a, b reason) int { return int(b.level.rank()) - int(a.level.rank()) })
	for _, r := range hard {
		as.Reasons = append(as.Reasons, r.text)
	}
	for _, c := range comps {
		if c.value < cfg.Levels.Healthy-epsilon {
			as.Reasons = append(as.Reasons, fmt.Sprintf("%s %.2f: %s", c.name, c.value, c.why))
		}
	}
	if timedOut && as.Level == Failed {
		// Judged again as if the silence were not known (no timeout, no
		// open gap): nothing else makes it failed.
		quiet := o
		quiet.LastHeartbeat = time.Time{}
		as.Silent = a.Assess(quiet).Level != Failed
	}
	return as
}

// components returns the known components with a positive weight.
func (a *Assessor) components(o Observation) []component {
	cfg, w := a.cfg, a.cfg.Weights
	var out []component
	add := func(name string, weight, value float64, why string) {
		if weight > 0 {
			out = append(out, component{name: name, weight: weight, value: clamp01(value), why: why})
		}
	}
	if o.SelfReported != nil {
		add(ComponentSelfReported, w.SelfReported, *o.SelfReported, "the agent reports itself unwell")
	}
	if v, ok := a.regularity(o); ok {
		add(ComponentHeartbeatRegularity, w.HeartbeatRegularity, v, "heartbeats arrive late")
	}
	if n := o.Succeeded + o.Failed + o.Lost; n >= cfg.MinTasks {
		add(ComponentTaskCompletion, w.TaskCompletion, float64(o.Succeeded)/float64(n),
			fmt.Sprintf("%d of %d tasks did not succeed", o.Failed+o.Lost, n))
	}
	if o.Utilisation != nil {
		u := clamp01(*o.Utilisation)
		v := 1.0
		if u > cfg.UtilisationOK {
			v = (1 - u) / (1 - cfg.UtilisationOK)
		}
		add(ComponentResourceUtilisation, w.ResourceUtilisation, v, fmt.Sprintf("resources %s used", pct(u)))
	}
	if n := o.Succeeded + o.Failed; n >= cfg.MinTasks {
		add(ComponentErrorRate, w.ErrorRate, 1-float64(o.Failed)/float64(n),
			fmt.Sprintf("%d of %d tasks failed", o.Failed, n))
	}
	return out
}

// regularity is the mean of min(1, allowed/gap) over the heartbeat gaps,
// counting the gap still open at Now when it is already late.
func (a *Assessor) regularity(o Observation) (float64, bool) {
	allowed := float64(a.allowedGap(o))
	var sum float64
	var n int
	score := func(g time.Duration) {
		if g <= 0 {
			return
		}
		sum += min(1, allowed/float64(g))
		n++
	}
	for _, g := range o.HeartbeatGaps {
		score(g)
	}
	if !o.LastHeartbeat.IsZero() {
		if open := o.Now.Sub(o.LastHeartbeat); float64(open) > allowed {
			score(open)
		}
	}
	if n == 0 {
		return 0, false
	}
	return sum / float64(n), true
}

// allowedGap is the longest gap between o's heartbeats that is not late:
// its interval × (1 + heartbeat_tolerance).
func (a *Assessor) allowedGap(o Observation) time.Duration {
	interval := o.ExpectedInterval
	if interval <= 0 {
		interval = a.cfg.HeartbeatInterval.Std()
	}
	return time.Duration(float64(interval) * (1 + a.cfg.HeartbeatTolerance))
}

func (a *Assessor) levelOf(score float64) Level {
	l := a.cfg.Levels
	switch {
	case score >= l.Healthy-epsilon:
		return Healthy
	case score >= l.Degraded-epsilon:
		return Degraded
	case score >= l.Warning-epsilon:
		return Warning
	case score >= l.Critical-epsilon:
		return Critical
	}
	return Failed
}

func clamp01(v float64) float64 {
	if v != v { // NaN
		return 0
	}
	return min(max(v, 0), 1)
}

func pct(v float64) string { return fmt.Sprintf("%.0f%%", v*100) }

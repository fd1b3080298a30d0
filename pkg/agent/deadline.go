package agent

import (
	"fmt"
	"time"
)

// Report margin bounds: the handler is stopped this long before the step's
// deadline so that the failure can still be published in time.
const (
	minReportMargin = 50 * time.Millisecond
	maxReportMargin = 2 * time.Second
)

// reportMargin is a tenth of the time left, within [50ms, 2s].
func reportMargin(left time.Duration) time.Duration {
	return min(max(left/10, minReportMargin), maxReportMargin)
}

// plan is when a handler must stop, decided at now for a task.
type plan struct {
	// handlerDeadline is when the handler's context ends; zero: never.
	handlerDeadline time.Time
	// reportBy is the step's deadline: nothing is published after it; zero: none.
	reportBy time.Time
	// grace is how long to wait for a handler that ignores cancellation
	// before reporting without it.
	grace time.Duration
	// timeoutFirst says the step timeout, not the deadline, ends the handler.
	timeoutFirst bool
}

// planTask decides the handler's deadline: a margin before the step's
// deadline, and at most the step's timeout after start. ok is false when
// there is no time left to run at all.
func planTask(now, deadline time.Time, timeout time.Duration) (p plan, ok bool) {
	p.reportBy = deadline
	p.grace = maxReportMargin / 2
	if !deadline.IsZero() {
		left := deadline.Sub(now)
		margin := reportMargin(left)
		if left <= margin {
			return p, false
		}
		p.handlerDeadline = deadline.Add(-margin)
		p.grace = margin / 2
	}
	if timeout > 0 {
		if end := now.Add(timeout); p.handlerDeadline.IsZero() || end.Before(p.handlerDeadline) {
			p.handlerDeadline = end
			p.timeoutFirst = true
		}
	}
	return p, true
}

// late reports whether publishing at now would break the step's deadline.
func (p plan) late(now time.Time) bool {
	return !p.reportBy.IsZero() && !now.Before(p.reportBy)
}

// deadlineCause is the cause a handler's context of task t ends with at
// its deadline: ErrDeadline, naming the step timeout when that came first.
func (p plan) deadlineCause(t *Task) error {
	if p.timeoutFirst {
		return fmt.Errorf("%w: step timeout %s", ErrDeadline, t.Timeout)
	}
	return ErrDeadline
}

// notStarted is the failure of a handler whose deadline (cause) passed
// before it could start.
func notStarted(cause error) error {
	return fmt.Errorf("%w: passed before the handler could start", cause)
}

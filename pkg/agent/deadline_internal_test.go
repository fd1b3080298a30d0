package agent

import (
	"testing"
	"time"
)

func TestPlanTask(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name         string
		deadline     time.Duration // from now; 0 = none
		timeout      time.Duration
		ok           bool
		handlerIn    time.Duration // handler deadline from now; 0 = none
		timeoutFirst bool
	}{
		{name: "no deadline no timeout", ok: true},
		{name: "deadline 10s: 1s margin", deadline: 10 * time.Second, ok: true, handlerIn: 9 * time.Second},
		{name: "deadline 1m: margin capped at 2s", deadline: time.Minute, ok: true, handlerIn: 58 * time.Second},
		{name: "deadline 200ms: margin at least 50ms", deadline: 200 * time.Millisecond, ok: true, handlerIn: 150 * time.Millisecond},
		{name: "timeout before deadline", deadline: 10 * time.Second, timeout: time.Second, ok: true, handlerIn: time.Second, timeoutFirst: true},
		{name: "timeout after deadline", deadline: 10 * time.Second, timeout: time.Minute, ok: true, handlerIn: 9 * time.Second},
		{name: "timeout only", timeout: 3 * time.Second, ok: true, handlerIn: 3 * time.Second, timeoutFirst: true},
		{name: "deadline inside the margin", deadline: 40 * time.Millisecond, ok: false},
		{name: "deadline passed", deadline: -time.Second, ok: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var deadline time.Time
			if tt.deadline != 0 {
				deadline = now.Add(tt.deadline)
			}
			p, ok := planTask(now, deadline, tt.timeout)
			if ok != tt.ok {
				t.Fatalf("ok=%v, want %v", ok, tt.ok)
			}
			if !ok {
				return
			}
			var want time.Time
			if tt.handlerIn != 0 {
				want = now.Add(tt.handlerIn)
			}
			if !p.handlerDeadline.Equal(want) || p.timeoutFirst != tt.timeoutFirst {
				t.Fatalf("handler deadline %v (timeout first %v), want %v (%v)", p.handlerDeadline, p.timeoutFirst, want, tt.timeoutFirst)
			}
			if !deadline.IsZero() && (p.late(deadline.Add(-time.Nanosecond)) || !p.late(deadline)) {
				t.Fatal("late() is wrong at the deadline")
			}
		})
	}
}

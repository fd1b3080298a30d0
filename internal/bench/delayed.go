package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/wardenhq/warden/internal/schedule"
)

// runDelayed submits single-step jobs to start at a given time (a
// JetStream message schedule holds each submission until then:
// schedule.PublishDelayed) and measures how late their step's handler
// starts after that time (delayed_start_p99_ms). A job that starts early
// is counted and noted.
func (e *Env) runDelayed(tb *runTB) {
	const sec = "delayed jobs"
	var mu sync.Mutex
	started := map[string]time.Time{}
	d := e.deploy(tb, 8, 64, func(job string, at time.Time) {
		mu.Lock()
		if _, ok := started[job]; !ok {
			started[job] = at
		}
		mu.Unlock()
	})
	n := pick(e, 200, 50)
	spread := pick(e, 4*time.Second, 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := singleStepSpec("noop", "")
	base := time.Now().Add(2 * time.Second)
	due := make(map[string]time.Time, n)
	for i := range n {
		id := fmt.Sprintf("delayed-%d", i)
		at := base.Add(time.Duration(i) * spread / time.Duration(n))
		if _, err := schedule.PublishDelayed(ctx, d.js, submission(id, spec), at); err != nil {
			tb.Fatalf("delayed submit: %v", err)
		}
		due[id] = at
	}
	before := d.track.Count()
	if !d.track.waitCount(before+n, time.Until(base.Add(spread).Add(time.Minute))) {
		tb.Fatalf("only %d of %d delayed jobs finished", d.track.Count()-before, n)
	}
	var late []time.Duration
	early := 0
	mu.Lock()
	for id, at := range due {
		s, ok := started[id]
		if !ok {
			continue
		}
		if s.Before(at) {
			early++
		}
		late = append(late, s.Sub(at))
	}
	mu.Unlock()
	if early > 0 {
		e.rep.Note("delayed: %d of %d jobs started before their time", early, n)
	}
	e.rep.Add(Figure{Section: sec, Key: "delayed_start_p99_ms", Label: "delayed job: handler start after its time, p99", Value: ms(percentile(late, 99)), Unit: "ms",
		Note: fmt.Sprintf("%d single-step jobs due over %s (schedule.PublishDelayed); p50 %.1f ms, max %.1f ms; %d started early",
			len(late), spread, ms(percentile(late, 50)), ms(percentile(late, 100)), early)})
	e.rep.Add(Figure{Section: sec, Key: "delayed_start_p50_ms", Label: "delayed job: handler start after its time, p50", Value: ms(percentile(late, 50)), Unit: "ms"})
	e.logf("delayed: start after due p50 %.1f ms, p99 %.1f ms, %d early", ms(percentile(late, 50)), ms(percentile(late, 99)), early)
}

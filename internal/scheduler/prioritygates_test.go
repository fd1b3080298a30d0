package scheduler_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ratelimit"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/protocol"
)

// overtaken counts the jobs of ids that the agents started after since
// and before job started, and fails when job never started.
func overtaken(t *testing.T, got []run, job string, since time.Time, ids []string) int {
	t.Helper()
	i := slices.IndexFunc(got, func(r run) bool { return r.job == job })
	if i < 0 {
		t.Fatalf("%s never started", job)
	}
	n := 0
	for _, r := range got {
		if slices.Contains(ids, r.job) && !r.start.Before(since) && r.start.Before(got[i].start) {
			n++
		}
	}
	return n
}

// TestHighPriorityOvertakesKeyQueue: low-priority jobs queue for a
// concurrency key of limit 1 (the agent has room for more: the key is what
// they wait for); a high-priority job submitted behind them takes the
// key's next free slot instead of waiting for all of them.
func TestHighPriorityOvertakesKeyQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	var rs runs
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "a1", Pool: "default", MaxConcurrent: 4})
	a.Script(rs.script("a1", 50*time.Millisecond))
	job := func(p string) string {
		return fmt.Sprintf(`{"name":%q,"priority":%q,"concurrency":{"key":"serial","limit":1},"steps":[{"id":"s","action":"echo"}]}`, p, p)
	}
	lows := publishJobs(t, b, 30, "low", job("low"))
	natstest.Eventually(t, 15*time.Second, "low jobs queued for the key", func() bool {
		// A step ran: the bucket exists (the scheduler makes it).
		return len(rs.snapshot()) > 0 && len(keyState(t, b, "serial").Waiters) >= 20
	})
	since := time.Now()
	high := publishJobs(t, b, 1, "high", job("high"))
	all := append(slices.Clone(lows), high...)
	natstest.Eventually(t, 30*time.Second, "every job ended", func() bool { _, ok := b.allEnded(t, all); return ok })
	got := rs.snapshot()
	slices.SortFunc(got, func(x, y run) int { return x.start.Compare(y.start) })
	if ov := overlaps(got); len(ov) > 0 {
		t.Fatalf("executions overlapped on a key of limit 1: %v", ov)
	}
	// The slot held when the high job queued, and one granted as it
	// queued, may go to low jobs; the next is the high job's.
	n := overtaken(t, got, high[0], since, lows)
	t.Logf("%d low jobs started after the high one was submitted and before it", n)
	if n > 2 {
		t.Fatalf("%d low jobs queued before the high one took the key before it, want at most 2", n)
	}
}

// TestHighPriorityOvertakesRateLimitLine: low-priority jobs wait in line
// for a rate limit's grants (10/s, burst 1); a high-priority job submitted
// behind them asks again at the limit's next grant instead of at the end
// of their line, and starts within a few grants.
func TestHighPriorityOvertakesRateLimitLine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{RateLimits: ratelimit.Config{
		"slow": {Limit: 10, Interval: protocol.Duration(time.Second), Burst: 1}}})
	var rs runs
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "a1", Pool: "default", MaxConcurrent: 16})
	a.Script(rs.script("a1", 0))
	job := func(p string) string {
		return fmt.Sprintf(`{"name":%q,"priority":%q,"steps":[{"id":"s","action":"echo","rate_limit":"slow"}]}`, p, p)
	}
	lows := publishJobs(t, b, 40, "low", job("low"))
	natstest.Eventually(t, 15*time.Second, "low jobs in line for the limit", func() bool { return len(rs.snapshot()) >= 3 })
	since := time.Now()
	high := publishJobs(t, b, 1, "high", job("high"))
	all := append(slices.Clone(lows), high...)
	natstest.Eventually(t, 30*time.Second, "every job ended", func() bool { _, ok := b.allEnded(t, all); return ok })
	got := rs.snapshot()
	slices.SortFunc(got, func(x, y run) int { return x.start.Compare(y.start) })
	n := overtaken(t, got, high[0], since, lows)
	t.Logf("%d low jobs started after the high one was submitted and before it (%d in all)", n, len(lows))
	if n > 5 {
		t.Fatalf("%d low jobs in line before the high one started before it, want at most 5", n)
	}
}

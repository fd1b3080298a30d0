package bench

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/internal/scheduler"
)

// runHistory leaves many finished jobs in the job store, then measures
// what they must not slow down: listing jobs (ops.ListJobs, what `warden
// jobs ls` calls: all jobs, and --state running), a supervisor process
// started afresh until it leads, and single-step jobs submitted one at a
// time, against the same probes on the same deployment before the history.
// No supervisor runs while the history is made, so the fresh one is the
// first to lead.
func (e *Env) runHistory(tb *runTB) {
	const sec = "after many finished jobs"
	n := e.cfg.HistoryJobs
	if n <= 0 {
		n = 20000
	}
	tag := fmt.Sprintf("%dk", n/1000)
	k := func(f string) string { return fmt.Sprintf(f, tag) }

	srv := e.startServer(tb)
	startScheduler(tb, srv.URL, scheduler.DefaultConfig())
	nc, js := connect(tb, srv.URL, "bench-history")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	fleet, err := StartFleet(ctx, FleetConfig{URL: srv.URL, Agents: 8, MaxConcurrent: 64, AgentsPerConn: 4})
	if err != nil {
		tb.Fatalf("fleet: %v", err)
	}
	tb.Cleanup(fleet.Stop)
	d := &deployment{srv: srv, nc: nc, js: js, fleet: fleet, track: newTracker(tb, js)}
	d.runJobs(tb, "warmup", 1, 1, func(int) []byte { return singleStepSpec("noop", "") }, time.Minute)

	probes := func(prefix string) []time.Duration {
		var out []time.Duration
		for i := range pick(e, 100, 40) {
			el, ok := d.submitWait(tb, fmt.Sprintf("%s-%d", prefix, i), singleStepSpec("noop", ""), 30*time.Second)
			if !ok {
				tb.Fatalf("probe %s-%d did not finish within 30s", prefix, i)
			}
			out = append(out, el)
		}
		return out
	}
	before := probes("before")

	t0 := time.Now()
	d.runJobs(tb, "hist", n, 4, func(int) []byte { return singleStepSpec("noop", "") }, 8*time.Minute)
	e.logf("history: %d jobs finished in %s", n, time.Since(t0).Round(time.Millisecond))
	e.rep.Set("history_jobs", n)

	after := probes("after")
	e.rep.Add(Figure{Section: sec, Key: k("submit_complete_after_%s_p50_ms"), Label: k("submit→complete p50 after %s jobs"), Value: ms(percentile(after, 50)), Unit: "ms",
		Note: fmt.Sprintf("%d single-step jobs one at a time; before the history: p50 %.2f ms, p99 %.2f ms", len(after), ms(percentile(before, 50)), ms(percentile(before, 99)))})
	e.rep.Add(Figure{Section: sec, Key: k("submit_complete_after_%s_p99_ms"), Label: k("submit→complete p99 after %s jobs"), Value: ms(percentile(after, 99)), Unit: "ms"})
	if b := percentile(before, 50); b > 0 {
		e.rep.Add(atMost(Figure{Section: sec, Key: k("submit_complete_after_%s_to_before_p50"), Label: "submit→complete p50, after ÷ before", Value: float64(percentile(after, 50)) / float64(b), Unit: "x",
			Note: "unaffected: about 1"}, 1.5, "x"))
	}

	store, err := jobstore.Open(ctx, js)
	if err != nil {
		tb.Fatalf("store: %v", err)
	}
	o := ops.New(nc, store)
	// A real `warden jobs ls` is one cold call: the figure is the slowest
	// of 3 calls (normally the first, the cold one), not their median.
	type listed struct {
		first, median, max time.Duration
		page               ops.JobsPage
	}
	list := func(f jobstore.ListFilter) listed {
		var ds []time.Duration
		var page ops.JobsPage
		for range 3 {
			lctx, lcancel := context.WithTimeout(ctx, time.Minute)
			t := time.Now()
			p, err := o.ListJobs(lctx, f)
			ds = append(ds, time.Since(t))
			lcancel()
			if err != nil {
				tb.Fatalf("list jobs: %v", err)
			}
			page = p
		}
		l := listed{first: ds[0], page: page}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		l.median, l.max = ds[1], ds[2]
		return l
	}
	all := list(jobstore.ListFilter{})
	e.rep.Add(below(Figure{Section: sec, Key: k("jobs_ls_%s_s"), Label: k("warden jobs ls, %s finished jobs"), Value: all.max.Seconds(), Unit: "s",
		Note: fmt.Sprintf("ops.ListJobs, first page (%d jobs of %d matched), slowest of 3 calls (first, cold %.3f s; median %.3f s; earlier runs reported the median)",
			len(all.page.Jobs), all.page.Matched, all.first.Seconds(), all.median.Seconds())}, 1, "s"))
	running := list(jobstore.ListFilter{States: []jobstore.JobState{jobstore.JobRunning}})
	e.rep.Add(below(Figure{Section: sec, Key: k("jobs_ls_running_%s_s"), Label: k("warden jobs ls --state running, %s finished jobs"), Value: running.max.Seconds(), Unit: "s",
		Note: fmt.Sprintf("%d matched, slowest of 3 calls (first %.3f s; median %.3f s)", running.page.Matched, running.first.Seconds(), running.median.Seconds())}, 1, "s"))
	e.logf("history: jobs ls %s (first %s, median %s), --state running %s", all.max.Round(time.Millisecond), all.first.Round(time.Millisecond), all.median.Round(time.Millisecond), running.max.Round(time.Millisecond))

	t1 := time.Now()
	sup := e.supervisorProc(tb, srv.URL, "sup-history", 4)
	sup.WaitOutput(tb, "leading:", 2*time.Minute)
	leading := time.Since(t1)
	sup.WaitOutput(tb, "recovery index built", 2*time.Minute)
	lead := time.Since(t1)
	e.rep.Add(below(Figure{Section: sec, Key: k("supervisor_lead_%s_s"), Label: k("fresh supervisor leads, %s finished jobs"), Value: lead.Seconds(), Unit: "s",
		Note: fmt.Sprintf("process start to its `recovery index built` log line (`leading:` after %.2f s); no other supervisor holds the lease", leading.Seconds())}, 5, "s"))
	e.logf("history: fresh supervisor leads after %s", lead.Round(time.Millisecond))
}

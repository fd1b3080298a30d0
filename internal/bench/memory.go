package bench

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// indexedRE reads how many records the supervisor's recovery index holds
// from its "recovery index built" log line.
var indexedRE = regexp.MustCompile(`"(?:unfinished_records|due_items)":(\d+)`)

// runMemory writes many queued steps into the job store and measures the
// RSS of a supervisor that indexes them at start-up, and of a scheduler
// running beside them. Steps are dispatched to agents that do not run,
// with leases an hour away: queued work the supervisor must track, none of
// which falls due during the measurement. Jobs have 100 steps each.
func (e *Env) runMemory(tb *runTB) {
	const sec = "memory"
	steps := e.cfg.RSSSteps
	if steps <= 0 {
		steps = pick(e, 1_000_000, 100_000)
	}
	const perJob = 100
	jobs := (steps + perJob - 1) / perJob
	steps = jobs * perJob
	srv := e.startServer(tb)
	_, js := connect(tb, srv.URL, "bench-memory")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		tb.Fatalf("streams: %v", err)
	}
	var sp spec.Job
	sp.Name = "queued"
	for i := 0; i < perJob; i++ {
		sp.Steps = append(sp.Steps, spec.Step{ID: fmt.Sprintf("s%d", i), Action: "noop"})
	}
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		tb.Fatalf("store: %v", err)
	}
	now := time.Now().UTC()
	t0 := time.Now()
	// Records are encoded by the store (JobWrite, StepWrite: the layout
	// and headers the scheduler writes) and published here without
	// waiting for each PubAck.
	publish := func(w jobstore.Write) {
		if _, err := publishAsync(js, w.Msg); err != nil {
			tb.Fatalf("write %s: %v", w.Key, err)
		}
	}
	for j := 0; j < jobs; j++ {
		id := "q-" + strconv.Itoa(j)
		job := jobstore.NewJob(id, sp, now)
		job.State = jobstore.JobRunning
		publish(store.JobWrite(job, 0))
		sts, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: 5 * time.Minute, MaxRetries: 3}, now)
		if err != nil {
			tb.Fatalf("steps: %v", err)
		}
		for k, st := range sts {
			_ = st.Dispatch(fmt.Sprintf("ghost-%d", (j*perJob+k)%5000), protocol.NewLeaseToken(), now, time.Hour)
			publish(store.StepWrite(st, 0))
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		tb.Fatalf("queued steps not stored")
	}
	e.logf("memory: wrote %d jobs, %d queued steps in %s", jobs, steps, time.Since(t0).Round(time.Millisecond))

	t1 := time.Now()
	sup := e.supervisorProc(tb, srv.URL, "sup-mem", 4)
	sup.WaitOutput(tb, "recovery index built", 10*time.Minute)
	indexS := time.Since(t1).Seconds()
	due := 0
	if m := indexedRE.FindStringSubmatch(sup.Output()); m != nil {
		due, _ = strconv.Atoi(m[1])
	}
	time.Sleep(time.Second)
	rss, hwm, _ := memStatus(sup.PID())
	sched := e.schedulerProc(tb, srv.URL, 4)
	time.Sleep(time.Second)
	srss, shwm, _ := memStatus(sched.PID())

	label := "1m"
	if steps != 1_000_000 {
		label = fmt.Sprintf("%dk", steps/1000)
	}
	note := fmt.Sprintf("%d queued steps in %d jobs, index of %d items built in %.1fs; peak %.0f MiB", steps, jobs, due, indexS, mib(hwm))
	f := Figure{Section: sec, Key: "supervisor_rss_" + label + "_steps_mib", Label: fmt.Sprintf("supervisor RSS, %d queued steps", steps), Value: mib(rss), Unit: "MiB", Note: note}
	if steps == 1_000_000 {
		f = below(f, 1024, "MiB")
	}
	e.rep.Add(f)
	e.rep.Add(Figure{Section: sec, Key: "supervisor_peak_rss_" + label + "_steps_mib", Label: fmt.Sprintf("supervisor peak RSS, %d queued steps", steps), Value: mib(hwm), Unit: "MiB"})
	e.rep.Add(Figure{Section: sec, Key: "supervisor_index_" + label + "_steps_s", Label: "supervisor start-up index build", Value: indexS, Unit: "s"})
	e.rep.Add(Figure{Section: sec, Key: "scheduler_rss_" + label + "_steps_mib", Label: fmt.Sprintf("scheduler RSS, %d queued steps", steps), Value: mib(srss), Unit: "MiB",
		Note: fmt.Sprintf("the scheduler keeps no per-step state; peak %.0f MiB", mib(shwm))})
	if steps != 1_000_000 {
		// Explicitly an extrapolation: linear in the number of steps.
		per := float64(rss) / float64(steps)
		e.rep.Add(below(Figure{Section: sec, Key: "supervisor_rss_1m_steps_mib", Label: "supervisor RSS, 1,000,000 steps (EXTRAPOLATED)", Value: mib(uint64(per * 1e6)), Unit: "MiB",
			Note: fmt.Sprintf("linear extrapolation from %d steps, not measured", steps)}, 1024, "MiB"))
		e.rep.Set("supervisor_rss_1m_steps_method", fmt.Sprintf("extrapolated linearly from %d steps", steps))
	} else {
		e.rep.Set("supervisor_rss_1m_steps_method", "measured")
	}
	e.logf("memory: supervisor RSS %.0f MiB (peak %.0f), scheduler %.0f MiB, index %.1fs", mib(rss), mib(hwm), mib(srss), indexS)
}

package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
	"github.com/wardenhq/warden/test/procs"
)

// deployment is a Warden as it is deployed: the scheduler binary with its
// defaults in its own process (its allocation rate makes its GC settings
// part of what is measured), and in this process one supervisor with its
// defaults and a fleet of light agents.
type deployment struct {
	srv   *natsServer
	sched *procs.Proc
	nc    *nats.Conn
	js    jetstream.JetStream
	fleet *Fleet
	track *tracker
}

func (e *Env) deploy(tb *runTB, agents, maxConcurrent int, onTask func(string, time.Time)) *deployment {
	srv := e.startServer(tb)
	sched := e.schedulerProc(tb, srv.URL, streams.DefaultTaskShards)
	startSupervisor(tb, srv.URL, supervisor.Config{ID: "bench-sup"})
	nc, js := connect(tb, srv.URL, "bench-client")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fleet, err := StartFleet(ctx, FleetConfig{URL: srv.URL, Agents: agents, MaxConcurrent: maxConcurrent, AgentsPerConn: 4,
		OnTask: onTask})
	if err != nil {
		tb.Fatalf("fleet: %v", err)
	}
	tb.Cleanup(fleet.Stop)
	d := &deployment{srv: srv, sched: sched, nc: nc, js: js, fleet: fleet, track: newTracker(tb, js)}
	// Wait until the scheduler sees the agents: one job must complete.
	d.runJobs(tb, "warmup", 1, 1, func(int) []byte { return singleStepSpec("noop", "") }, time.Minute)
	return d
}

// watch starts measuring a window of a deployment's work: nats-server, the
// scheduler and this process (measure).
func (e *Env) watch(tb *runTB, d *deployment, name string, dur time.Duration) func() (map[string]float64, float64) {
	return e.measure(tb, d.srv, name, dur, map[string]int{"scheduler": d.sched.PID(), "bench": os.Getpid()}, profileOf("scheduler", d.sched))
}

// measure starts measuring a window: the CPU of srv ("server") and of the
// processes pids names from /proc, the machine's busy share, and (with
// --profile-dir) the profiles of srv, this process and others, named name.
// The returned func ends the window and gives cores per process and busy.
func (e *Env) measure(tb *runTB, srv *natsServer, name string, dur time.Duration, pids map[string]int, others ...remoteProfile) func() (map[string]float64, float64) {
	pids["server"] = srv.PID()
	meter := newCPUMeter(pids)
	machine := newMachineMeter()
	stopProfiles := e.startProfiles(tb, srv, name, dur, others...)
	return func() (map[string]float64, float64) {
		cores, busy := meter.Cores(), machine.Busy()
		stopProfiles()
		return cores, busy
	}
}

// runJobs submits n jobs from pubs publishers asynchronously and waits for
// all of them to finish. It returns the time from the first publish to the
// last job_finished event.
func (d *deployment) runJobs(tb *runTB, prefix string, n, pubs int, spec func(i int) []byte, timeout time.Duration) time.Duration {
	before := d.track.Count()
	start := time.Now()
	var wg sync.WaitGroup
	for p := 0; p < pubs; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for i := p; i < n; i += pubs {
				if _, err := publishAsync(d.js, submission(fmt.Sprintf("%s-%d", prefix, i), spec(i))); err != nil {
					tb.Logf("submit: %v", err)
				}
			}
		}(p)
	}
	wg.Wait()
	select {
	case <-d.js.PublishAsyncComplete():
	case <-time.After(timeout):
	}
	if !d.track.waitCount(before+n, timeout) {
		tb.Fatalf("%s: only %d of %d jobs finished within %s", prefix, d.track.Count()-before, n, timeout)
	}
	return time.Since(start)
}

// keepInFlight submits single jobs named <prefix>-<n> for dur, keeping
// inFlight of them unfinished at any time. It returns how many it
// submitted and how many finished within the window, and the window.
func (d *deployment) keepInFlight(tb *runTB, prefix string, spec []byte, inFlight int, dur time.Duration) (submitted, done int, el time.Duration) {
	base := d.track.Count()
	start := time.Now()
	for time.Since(start) < dur {
		for submitted-(d.track.Count()-base) < inFlight {
			if _, err := publishAsync(d.js, submission(fmt.Sprintf("%s-%d", prefix, submitted), spec)); err != nil {
				tb.Fatalf("submit: %v", err)
			}
			submitted++
		}
		select {
		case <-d.track.notify:
		case <-time.After(5 * time.Millisecond):
		}
	}
	return submitted, d.track.Count() - base, time.Since(start)
}

// runThroughput keeps a fixed number of single-step jobs in flight for a
// fixed time and counts the jobs whose terminal record arrived in that
// window; then it lets the rest finish and counts every JetStream write
// they made. The server's and this process's CPU are read from /proc over
// the window (with --profile-dir, both are profiled too).
func (e *Env) runThroughput(tb *runTB) {
	const sec = "Warden throughput"
	agents := 8
	d := e.deploy(tb, agents, 64, nil)
	d.runJobs(tb, "warm", 500, 4, func(int) []byte { return singleStepSpec("noop", "") }, time.Minute)

	inFlight := pick(e, 2000, 1000)
	dur := pick(e, 8*time.Second, 4*time.Second)
	spec := singleStepSpec("noop", "")
	before := streamSeqs(tb, d.js)
	delivered := schedulerDeliveries(tb, d.js)
	base := d.track.Count()
	window := e.watch(tb, d, "throughput", dur)
	submitted, done, el := d.keepInFlight(tb, "job", spec, inFlight, dur)
	cores, busy := window()
	if !d.track.waitCount(base+submitted, 2*time.Minute) {
		tb.Fatalf("only %d of %d jobs finished", d.track.Count()-base, submitted)
	}
	time.Sleep(200 * time.Millisecond) // the last acks
	after := streamSeqs(tb, d.js)
	delivered = schedulerDeliveries(tb, d.js) - delivered
	writes, by := writesBetween(before, after)
	jps := float64(done) / el.Seconds()
	wpj := float64(writes) / float64(submitted)
	e.rep.Add(atLeast(Figure{Section: sec, Key: "jobs_per_s", Label: "single-step jobs", Value: jps, Unit: "jobs/s",
		Note: fmt.Sprintf("%d in flight for %s (%d finished), %d SDK agents × 64 and 1 supervisor in one process, the scheduler binary in its own", inFlight, dur, done, agents)}, 10000, "jobs/s"))
	e.rep.Add(atMost(Figure{Section: sec, Key: "writes_per_job", Label: "JetStream writes per job", Value: wpj, Unit: "writes",
		Note: fmt.Sprintf("%d jobs; counted: stored messages in every stream and bucket but presence, health and leases; not counted: the delete marker warden_jobs stores when each record written with the retention TTL expires (see writes_per_job_with_expiry)", submitted)}, 6, "writes"))
	e.rep.Set("writes_per_job_by_stream", perJob(by, submitted))
	if ttl, sampled := ttlRecordsPerJob(tb, d.js, "job", submitted, 50); sampled > 0 {
		e.rep.Add(Figure{Section: sec, Key: "writes_per_job_with_expiry", Label: "JetStream writes per job, expiry markers included", Value: wpj + ttl, Unit: "writes",
			Note: fmt.Sprintf("writes_per_job + %.2f records per job written with the retention TTL (from %d jobs' records), each of which stores one delete marker when it expires, days later", ttl, sampled)})
	}
	e.rep.Add(Figure{Section: sec, Key: "scheduler_deliveries_per_job", Label: "scheduler deliveries per job", Value: float64(delivered) / float64(submitted), Unit: "msgs",
		Note: "submissions and results delivered to the scheduler, redeliveries of jobs waiting for a slot included; 2 without waiting"})
	e.rep.Add(Figure{Section: sec, Key: "throughput_server_cpu_cores", Label: "nats-server CPU during jobs_per_s", Value: cores["server"], Unit: "cores",
		Note: fmt.Sprintf("from /proc over the window; machine busy %.0f%% of %d cores (everyone's load included)", 100*busy, runtime.NumCPU())})
	gc := fmt.Sprintf("gc_percent %d", scheduler.DefaultGCPercent)
	if v := os.Getenv("GOGC"); v != "" {
		gc = "GOGC=" + v + " from the environment, which wins over gc_percent"
	}
	if e.cfg.ProfileDir != "" {
		gc += "; CPU-profiled meanwhile"
	}
	e.rep.Add(Figure{Section: sec, Key: "throughput_scheduler_cpu_cores", Label: "scheduler CPU", Value: cores["scheduler"], Unit: "cores",
		Note: fmt.Sprintf("%.3f ms per job; the scheduler binary with its defaults (%s)", 1000*cores["scheduler"]/jps, gc)})
	e.rep.Add(Figure{Section: sec, Key: "throughput_scheduler_ms_per_job", Label: "scheduler CPU per job", Value: 1000 * cores["scheduler"] / jps, Unit: "ms"})
	// Until session 7 the bench process held the scheduler too and this
	// figure was throughput_bench_cpu_cores: a new key, so that a --before
	// column does not compare the two.
	e.rep.Add(Figure{Section: sec, Key: "throughput_bench_process_cpu_cores", Label: "supervisor, agents and bench CPU", Value: cores["bench"], Unit: "cores",
		Note: "one process: the supervisor, SDK agents, submitter and tracker (Go's default GC)"})
	e.rep.Add(Figure{Section: sec, Key: "throughput_machine_busy", Label: "machine CPU busy during jobs_per_s", Value: busy, Unit: "fraction"})
	e.logf("throughput: %.0f jobs/s, %.2f writes/job (%s); cores %v, machine busy %.0f%%", jps, wpj, by, cores, 100*busy)
	if f := d.track.failures(); f > 0 {
		e.rep.Note("throughput: %d jobs did not succeed", f)
	}

	// 10-step chains, submitted at once.
	chains := pick(e, 150, 40)
	cel := d.runJobs(tb, "chain", chains, 2, func(int) []byte { return chainSpec(10) }, 5*time.Minute)
	sps := float64(chains*10) / cel.Seconds()
	e.rep.Add(Figure{Section: sec, Key: "chain_steps_per_s", Label: "10-step chains", Value: sps, Unit: "steps/s",
		Note: fmt.Sprintf("%d chains submitted at once", chains)})
	e.logf("throughput: chains %.0f steps/s", sps)
}

// ttlRecordsPerJob reads the job and step records of up to sample of the
// jobs <prefix>-0..n-1 and returns how many of them per job carry the
// retention TTL (Nats-TTL), and how many jobs it read. warden_jobs has
// limit markers: each such record stores one delete marker when it
// expires, a write the throughput window does not see.
func ttlRecordsPerJob(tb *runTB, js jetstream.JetStream, prefix string, n, sample int) (float64, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.Stream(ctx, "KV_"+protocol.BucketJobs)
	if err != nil {
		tb.Logf("ttl records: %v", err)
		return 0, 0
	}
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		tb.Logf("ttl records: %v", err)
		return 0, 0
	}
	step := max(1, n/sample)
	records, jobs := 0, 0
	for i := 0; i < n && jobs < sample; i += step {
		id := fmt.Sprintf("%s-%d", prefix, i)
		m, err := kv.GetLastMsgForSubject(ctx, "$KV."+protocol.BucketJobs+"."+protocol.JobKey(id))
		if err != nil {
			tb.Logf("ttl records: job %s: %v", id, err)
			continue
		}
		snap, err := store.Load(ctx, id)
		if err != nil {
			tb.Logf("ttl records: job %s: %v", id, err)
			continue
		}
		if m.Header.Get("Nats-TTL") != "" {
			records++
		}
		records += len(snap.Expiring) // step records (none for an inline job)
		jobs++
	}
	if jobs == 0 {
		return 0, 0
	}
	return float64(records) / float64(jobs), jobs
}

// perJob turns "A=600 B=1200" for n jobs into "A=1.00 B=2.00".
func perJob(by string, n int) string {
	var out []string
	for _, part := range splitFields(by) {
		var name string
		var v uint64
		for i := len(part) - 1; i >= 0; i-- {
			if part[i] == '=' {
				name = part[:i]
				fmt.Sscanf(part[i+1:], "%d", &v)
				break
			}
		}
		out = append(out, fmt.Sprintf("%s=%.2f", name, float64(v)/float64(n)))
	}
	return joinFields(out)
}

func (e *Env) runLatency(tb *runTB) {
	const sec = "Warden latency"
	var mu sync.Mutex
	dispatched := map[string]time.Time{}
	d := e.deploy(tb, 8, 64, func(job string, at time.Time) {
		mu.Lock()
		if _, ok := dispatched[job]; !ok {
			dispatched[job] = at
		}
		mu.Unlock()
	})
	ctx := context.Background()
	d.runJobs(tb, "warm", 100, 2, func(int) []byte { return singleStepSpec("noop", "") }, time.Minute)

	// Low load: one job at a time, synchronous submit. 1,000 jobs (about
	// 2 s): the probe target of the dag phase is 3 × this p99, and the p99
	// of 200 (their 3rd largest) moved by half from run to run.
	n := pick(e, 1000, 200)
	var comp, disp []time.Duration
	spec := singleStepSpec("noop", "")
	lowMissing := 0
	lowStart := time.Now()
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("low-%d", i)
		done := d.track.wait(id)
		t0 := time.Now()
		if _, err := d.js.PublishMsg(ctx, submission(id, spec)); err != nil {
			tb.Fatalf("submit: %v", err)
		}
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			tb.Fatalf("job %s did not finish", id)
		}
		at, ok := d.track.at(id)
		if !ok {
			tb.Fatalf("low load: job %s has no terminal time", id)
		}
		comp = append(comp, at.Sub(t0))
		mu.Lock()
		dt, ok := dispatched[id]
		mu.Unlock()
		if !ok {
			lowMissing++
			continue
		}
		disp = append(disp, dt.Sub(t0))
	}
	lowEl := time.Since(lowStart)
	if lowMissing > 0 {
		e.rep.Note("latency: %d of %d low-load jobs had no dispatch time; left out of submit_dispatch_low_p50_ms", lowMissing, n)
	}
	e.rep.Add(below(Figure{Section: sec, Key: "submit_complete_p50_ms", Label: "submit→complete p50, low load", Value: ms(percentile(comp, 50)),
		Unit: "ms", Note: fmt.Sprintf("%d jobs one at a time (%.1f s); p99 %.2f ms; submit→dispatch p50 %.2f ms", n, lowEl.Seconds(), ms(percentile(comp, 99)), ms(percentile(disp, 50)))}, 2, "ms"))
	e.rep.Add(Figure{Section: sec, Key: "submit_complete_low_p99_ms", Label: "submit→complete p99, low load", Value: ms(percentile(comp, 99)), Unit: "ms",
		Note: fmt.Sprintf("nearest rank over %d jobs", n)})
	e.rep.Add(Figure{Section: sec, Key: "submit_dispatch_low_p50_ms", Label: "submit→dispatch p50, low load", Value: ms(percentile(disp, 50)), Unit: "ms"})
	e.logf("latency: low load complete p50 %.2f ms, p99 %.2f ms over %d jobs in %s", ms(percentile(comp, 50)), ms(percentile(comp, 99)), n, lowEl.Round(time.Millisecond))

	// Half of the maximum: paced asynchronous submissions.
	rate, ok := e.rep.Value("jobs_per_s")
	how := "half of jobs_per_s measured above"
	if !ok || rate <= 0 {
		rate, how = 400, "no throughput phase in this run: 200 jobs/s assumed as half"
	}
	rate /= 2
	e.halfRate = rate
	dur := pick(e, 8*time.Second, 3*time.Second)
	total := int(rate * dur.Seconds())
	// Each job's clock starts when it was due (start + i/rate), not when
	// the sender got to it: a sender stalled on a busy machine would
	// otherwise time a burst of late jobs from their late sends
	// (coordinated omission). The time from the actual send is kept too.
	due := make(map[string]time.Time, total)
	sent := make(map[string]time.Time, total)
	before := d.track.Count()
	window := e.watch(tb, d, "halfload", dur)
	pace(rate, total, func(i int, at time.Time) {
		id := fmt.Sprintf("half-%d", i)
		due[id] = at
		sent[id] = time.Now()
		if _, err := publishAsync(d.js, submission(id, spec)); err != nil {
			tb.Fatalf("submit: %v", err)
		}
	})
	cores, busy := window()
	if !d.track.waitCount(before+total, 2*time.Minute) {
		tb.Fatalf("half load: only %d of %d jobs finished", d.track.Count()-before, total)
	}
	lat := halfLatencies(due, sent, func(id string) (time.Time, bool) {
		mu.Lock()
		defer mu.Unlock()
		t, ok := dispatched[id]
		return t, ok
	}, d.track.at)
	if lat.missingDisp+lat.missingComp > total/100 {
		tb.Fatalf("half load: of %d jobs, %d have no dispatch time and %d no terminal time", total, lat.missingDisp, lat.missingComp)
	}
	comp, disp = lat.comp, lat.disp
	note := fmt.Sprintf("%.0f jobs/s offered for %s (%s), each timed from when it was due; machine busy %.0f%%, cores: server %.2f, scheduler %.2f, bench process %.2f",
		rate, dur, how, 100*busy, cores["server"], cores["scheduler"], cores["bench"])
	if lat.missingDisp+lat.missingComp > 0 {
		note += fmt.Sprintf("; %d jobs without a dispatch time and %d without a terminal time left out", lat.missingDisp, lat.missingComp)
		e.rep.Note("latency: at half load %d of %d jobs had no dispatch time and %d no terminal time; left out of the half-load figures", lat.missingDisp, total, lat.missingComp)
	}
	e.rep.Add(below(Figure{Section: sec, Key: "submit_dispatch_p99_ms", Label: "submit→dispatch p99, half load", Value: ms(percentile(disp, 99)), Unit: "ms",
		Note: note}, 5, "ms"))
	e.rep.Add(Figure{Section: sec, Key: "submit_dispatch_p50_ms", Label: "submit→dispatch p50, half load", Value: ms(percentile(disp, 50)), Unit: "ms"})
	e.rep.Add(Figure{Section: sec, Key: "submit_dispatch_max_ms", Label: "submit→dispatch max, half load", Value: ms(percentile(disp, 100)), Unit: "ms"})
	e.rep.Add(Figure{Section: sec, Key: "submit_complete_half_p50_ms", Label: "submit→complete p50, half load", Value: ms(percentile(comp, 50)), Unit: "ms"})
	e.rep.Add(Figure{Section: sec, Key: "submit_complete_half_p99_ms", Label: "submit→complete p99, half load", Value: ms(percentile(comp, 99)), Unit: "ms"})
	e.rep.Add(Figure{Section: sec, Key: "submit_complete_half_max_ms", Label: "submit→complete max, half load", Value: ms(percentile(comp, 100)), Unit: "ms"})
	e.rep.Add(Figure{Section: sec, Key: "submit_dispatch_from_send_p99_ms", Label: "send→dispatch p99, half load", Value: ms(percentile(lat.dispSent, 99)), Unit: "ms",
		Note: "timed from the actual send, as submit_dispatch_p99_ms was before it was timed from the due time; the gap to submit_dispatch_p99_ms is the sender's own lateness"})
	e.rep.Add(Figure{Section: sec, Key: "half_load_send_lag_p99_ms", Label: "send lateness p99, half load", Value: ms(percentile(lat.lag, 99)), Unit: "ms",
		Note: fmt.Sprintf("actual send − due time; max %.2f ms", ms(percentile(lat.lag, 100)))})
	e.rep.Set("latency_half_load_offered_per_s", round(rate))
	e.rep.Add(Figure{Section: sec, Key: "latency_half_load_machine_busy", Label: "machine CPU busy at half load", Value: busy, Unit: "fraction"})
	e.logf("latency: half load (%.0f/s) dispatch p99 %.2f ms (from send %.2f ms, send lag p99 %.2f ms), complete p99 %.2f ms",
		rate, ms(percentile(disp, 99)), ms(percentile(lat.dispSent, 99)), ms(percentile(lat.lag, 99)), ms(percentile(comp, 99)))
}

// latencies are a paced run's per-job times: from when each job was due
// (disp, comp), from its actual send (dispSent), and the sender's
// lateness (lag, send − due). Jobs without a dispatch or terminal time
// are counted, never given a value.
type latencies struct {
	disp, comp, dispSent, lag []time.Duration
	missingDisp, missingComp  int
}

func halfLatencies(due, sent map[string]time.Time, dispatched, finished func(string) (time.Time, bool)) latencies {
	var l latencies
	for id, t0 := range due {
		s := sent[id]
		l.lag = append(l.lag, s.Sub(t0))
		if dt, ok := dispatched(id); ok && !dt.IsZero() {
			l.disp = append(l.disp, dt.Sub(t0))
			l.dispSent = append(l.dispSent, dt.Sub(s))
		} else {
			l.missingDisp++
		}
		if ct, ok := finished(id); ok && !ct.IsZero() {
			l.comp = append(l.comp, ct.Sub(t0))
		} else {
			l.missingComp++
		}
	}
	return l
}

// pace calls send(i, due) for i = 0..total-1 at rate a second: on a 1 ms
// ticker, each tick sending every call due by then (call i once i/rate
// has passed; before, only after (i+1)/rate, a built-in
// lateness of one interval). due is when call i
// was scheduled, start + i/rate, whenever the sender gets to it: latency
// is timed from it, so that a stalled sender's late burst is not timed
// from its late sends (coordinated omission). The half-load phase paces
// Warden and the job-shaped pipeline with it, so both see the same
// arrivals.
func pace(rate float64, total int, send func(i int, due time.Time)) {
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for i := 0; i < total; {
		<-tick.C
		// Call i is due at i/rate: by now, calls 0..floor(elapsed·rate).
		n := int(time.Since(start).Seconds()*rate) + 1
		for ; i < n && i < total; i++ {
			send(i, dueAt(start, rate, i))
		}
	}
}

// dueAt is when a paced call i is due: start + i/rate.
func dueAt(start time.Time, rate float64, i int) time.Time {
	return start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
}

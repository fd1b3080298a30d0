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

	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/supervisor"
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
		Note: fmt.Sprintf("%d jobs; counted: stored messages in every stream and bucket but presence, health and leases", submitted)}, 6, "writes"))
	e.rep.Set("writes_per_job_by_stream", perJob(by, submitted))
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

	// Low load: one job at a time, synchronous submit.
	n := pick(e, 200, 50)
	var comp, disp []time.Duration
	spec := singleStepSpec("noop", "")
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
		at, _ := d.track.at(id)
		comp = append(comp, at.Sub(t0))
		mu.Lock()
		disp = append(disp, dispatched[id].Sub(t0))
		mu.Unlock()
	}
	e.rep.Add(atMost(Figure{Section: sec, Key: "submit_complete_p50_ms", Label: "submit→complete p50, low load", Value: ms(percentile(comp, 50)),
		Unit: "ms", Note: fmt.Sprintf("%d jobs one at a time; p99 %.2f ms; submit→dispatch p50 %.2f ms", n, ms(percentile(comp, 99)), ms(percentile(disp, 50)))}, 2, "ms"))
	e.rep.Add(Figure{Section: sec, Key: "submit_complete_low_p99_ms", Label: "submit→complete p99, low load", Value: ms(percentile(comp, 99)), Unit: "ms"})
	e.rep.Add(Figure{Section: sec, Key: "submit_dispatch_low_p50_ms", Label: "submit→dispatch p50, low load", Value: ms(percentile(disp, 50)), Unit: "ms"})
	e.logf("latency: low load complete p50 %.2f ms", ms(percentile(comp, 50)))

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
	sent := make(map[string]time.Time, total)
	before := d.track.Count()
	window := e.watch(tb, d, "halfload", dur)
	pace(rate, total, func(i int) {
		id := fmt.Sprintf("half-%d", i)
		sent[id] = time.Now()
		if _, err := publishAsync(d.js, submission(id, spec)); err != nil {
			tb.Fatalf("submit: %v", err)
		}
	})
	cores, busy := window()
	if !d.track.waitCount(before+total, 2*time.Minute) {
		tb.Fatalf("half load: only %d of %d jobs finished", d.track.Count()-before, total)
	}
	comp, disp = comp[:0], disp[:0]
	mu.Lock()
	for id, t0 := range sent {
		at, _ := d.track.at(id)
		comp = append(comp, at.Sub(t0))
		disp = append(disp, dispatched[id].Sub(t0))
	}
	mu.Unlock()
	note := fmt.Sprintf("%.0f jobs/s offered for %s (%s); machine busy %.0f%%, cores: server %.2f, scheduler %.2f, bench process %.2f",
		rate, dur, how, 100*busy, cores["server"], cores["scheduler"], cores["bench"])
	e.rep.Add(atMost(Figure{Section: sec, Key: "submit_dispatch_p99_ms", Label: "submit→dispatch p99, half load", Value: ms(percentile(disp, 99)), Unit: "ms",
		Note: note}, 5, "ms"))
	e.rep.Add(Figure{Section: sec, Key: "submit_dispatch_p50_ms", Label: "submit→dispatch p50, half load", Value: ms(percentile(disp, 50)), Unit: "ms"})
	e.rep.Add(Figure{Section: sec, Key: "submit_dispatch_max_ms", Label: "submit→dispatch max, half load", Value: ms(percentile(disp, 100)), Unit: "ms"})
	e.rep.Add(Figure{Section: sec, Key: "submit_complete_half_p50_ms", Label: "submit→complete p50, half load", Value: ms(percentile(comp, 50)), Unit: "ms"})
	e.rep.Add(Figure{Section: sec, Key: "submit_complete_half_p99_ms", Label: "submit→complete p99, half load", Value: ms(percentile(comp, 99)), Unit: "ms"})
	e.rep.Add(Figure{Section: sec, Key: "submit_complete_half_max_ms", Label: "submit→complete max, half load", Value: ms(percentile(comp, 100)), Unit: "ms"})
	e.rep.Set("latency_half_load_offered_per_s", round(rate))
	e.rep.Add(Figure{Section: sec, Key: "latency_half_load_machine_busy", Label: "machine CPU busy at half load", Value: busy, Unit: "fraction"})
	e.logf("latency: half load (%.0f/s) dispatch p99 %.2f ms, complete p99 %.2f ms", rate, ms(percentile(disp, 99)), ms(percentile(comp, 99)))
}

// pace calls send(i) for i = 0..total-1 at rate a second: on a 1 ms
// ticker, each tick sending every call due by then. The half-load phase
// paces Warden and the job-shaped pipeline with it, so both see the same
// arrivals.
func pace(rate float64, total int, send func(i int)) {
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for i := 0; i < total; {
		<-tick.C
		due := int(time.Since(start).Seconds() * rate)
		for ; i < due && i < total; i++ {
			send(i)
		}
	}
}

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrInterrupted is returned by Run when its context ended before every
// phase ran: the report holds the phases that did.
var ErrInterrupted = errors.New("bench interrupted")

// Run runs the selected phases and returns the report. A phase that fails
// is noted and the others still run. When ctx ends, the phase running
// finishes (its processes are stopped and its store removed by its own
// cleanup) and no other starts: Run returns the report so far and
// ErrInterrupted.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Log == nil {
		cfg.Log = os.Stderr
	}
	if cfg.Server == "" {
		cfg.Server = "binary"
	}
	for _, p := range cfg.Only {
		if !slices.Contains(Phases, p) {
			return nil, fmt.Errorf("unknown phase %q (phases: %s)", p, strings.Join(Phases, ","))
		}
	}
	if len(cfg.Only) == 0 {
		cfg.Only = Phases
	}
	e := &Env{cfg: cfg, rep: NewReport()}
	if cfg.WorkDir == "" {
		dir, err := os.MkdirTemp("", "warden-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		e.work = dir
	} else {
		e.work = cfg.WorkDir
	}
	e.recordMachine()
	var bins []string
	if slices.ContainsFunc(cfg.Only, func(p string) bool { return p != "raw" }) {
		// Every phase but raw runs the scheduler binary (deploy, or its own).
		bins = append(bins, "scheduler", "supervisor")
	}
	if slices.Contains(cfg.Only, "cluster") {
		bins = append(bins, "agent")
	}
	if err := e.prepare(bins); err != nil {
		return nil, err
	}
	start := time.Now()
	for _, p := range Phases {
		if !slices.Contains(cfg.Only, p) {
			continue
		}
		if ctx.Err() != nil {
			e.rep.Note("interrupted before phase %s", p)
			return e.rep, fmt.Errorf("%w before phase %s", ErrInterrupted, p)
		}
		// What earlier phases left in this process (the fleet and trackers
		// of the scale phase run here) shows before each phase.
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		e.logf("=== phase %s (this process: %d goroutines, heap %.0f MiB)", p, runtime.NumGoroutine(), mib(ms.HeapAlloc))
		t0 := time.Now()
		if err := e.phase(p); err != nil {
			e.logf("phase %s failed: %v", p, err)
			e.rep.Note("phase %s failed: %v", p, err)
		}
		e.rep.Set("phase_"+p+"_s", round(time.Since(t0).Seconds()))
	}
	e.rep.Set("bench_duration_s", round(time.Since(start).Seconds()))
	e.rep.Set("load_avg_1m_end", loadAvg())
	e.ratios()
	return e.rep, nil
}

func (e *Env) phase(name string) (err error) {
	tb := newTB(name, e.logf)
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(fatalError)
			if !ok {
				panic(r)
			}
			err = f
		}
		tb.Close()
	}()
	switch name {
	case "raw":
		e.runRaw(tb)
		e.sub("raw-jobs", e.runRawJobs)
	case "throughput":
		e.runThroughput(tb)
	case "latency":
		// Warden's deployment stops before the pipeline runs at its rate.
		e.sub("latency", e.runLatency)
		e.sub("raw-half-load", e.runRawJobsHalfLoad)
	case "dag":
		e.runDAG(tb)
	case "delayed":
		e.runDelayed(tb)
	case "concurrency":
		e.runConcurrency(tb)
	case "history":
		e.runHistory(tb)
	case "failover":
		e.runFailover(tb)
	case "cluster":
		e.runCluster(tb)
	case "scale":
		e.runScale(tb)
	case "memory":
		e.runMemory(tb)
	}
	return nil
}

func (e *Env) recordMachine() {
	r := e.rep
	r.Set("timestamp", time.Now().UTC().Format(time.RFC3339))
	r.Set("machine_cores", runtime.NumCPU())
	r.Set("gomaxprocs", runtime.GOMAXPROCS(0))
	r.Set("go_version", runtime.Version())
	r.Set("goos_goarch", runtime.GOOS+"/"+runtime.GOARCH)
	r.Set("nats_server_version", server.VERSION)
	r.Set("server_mode", e.cfg.Server)
	r.Set("quick", e.cfg.Quick)
	r.Set("load_avg_1m_start", loadAvg())
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				r.Set("cpu_model", strings.TrimSpace(strings.SplitN(l, ":", 2)[1]))
				break
			}
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/nats-io/nats.go" {
				r.Set("nats_go_version", d.Version)
			}
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				r.Set("git_revision", s.Value)
			}
		}
	}
	r.Set("server_settings", "JetStream, file storage, R1, fresh store per phase, loopback")
}

// ratios compares Warden's figures with raw JetStream from the same run.
func (e *Env) ratios() {
	r := e.rep
	const sec = "vs raw JetStream"
	add := func(key, label string, num, den float64, note string) {
		if den > 0 {
			r.Add(Figure{Section: sec, Key: key, Label: label, Value: num / den, Unit: "x", Note: note})
		}
	}
	v := func(k string) float64 { x, _ := r.Value(k); return x }
	has := func(keys ...string) bool {
		for _, k := range keys {
			if _, ok := r.Value(k); !ok {
				return false
			}
		}
		return true
	}
	if has("jobs_per_s", "raw_async_publish_per_s") {
		add("ratio_jobs_to_raw_async_publish", "jobs/s ÷ async publish/s", v("jobs_per_s"), v("raw_async_publish_per_s"), "")
		if has("writes_per_job") {
			add("ratio_job_writes_to_raw_async_publish", "job writes/s ÷ async publish/s", v("jobs_per_s")*v("writes_per_job"), v("raw_async_publish_per_s"),
				"the share of the broker's pipelined write rate Warden uses")
		}
	}
	if has("jobs_per_s", "raw_job_pipeline_per_s") {
		add("ratio_jobs_to_raw_job_pipeline", "jobs/s ÷ job-shaped pipeline/s", v("jobs_per_s"), v("raw_job_pipeline_per_s"),
			"how close Warden comes to the broker carrying the same messages with no Warden work")
	}
	if has("jobs_per_s", "throughput_server_cpu_cores", "raw_job_pipeline_server_ms_per_job") && v("jobs_per_s") > 0 {
		warden := 1000 * v("throughput_server_cpu_cores") / v("jobs_per_s")
		r.Add(Figure{Section: sec, Key: "throughput_server_ms_per_job", Label: "nats-server CPU per Warden job", Value: warden, Unit: "ms",
			Note: fmt.Sprintf("%.2f × the pipeline's %.3f ms: what Warden's own requests (reads, consumer traffic, watches) add", warden/v("raw_job_pipeline_server_ms_per_job"), v("raw_job_pipeline_server_ms_per_job"))})
		cores := float64(runtime.NumCPU())
		r.Add(Figure{Section: sec, Key: "broker_bound_jobs_per_s", Label: "jobs/s if nats-server had every core", Value: 1000 * cores / v("raw_job_pipeline_server_ms_per_job"), Unit: "jobs/s",
			Note: fmt.Sprintf("%.0f cores ÷ the pipeline's server CPU per job: no client on this machine, Warden or not, gets more through this broker", cores)})
	}
	if has("jobs_per_s", "raw_sync_publish_per_s") {
		add("ratio_jobs_to_raw_sync_publish", "jobs/s ÷ sync publish/s", v("jobs_per_s"), v("raw_sync_publish_per_s"), "")
		if has("writes_per_job") {
			add("ratio_job_writes_to_raw_sync_publish", "job writes/s ÷ sync publish/s", v("jobs_per_s")*v("writes_per_job"), v("raw_sync_publish_per_s"),
				"above 1: Warden pipelines writes; below: round trips bound it")
		}
	}
	if has("jobs_per_s", "raw_consume_ack_per_s") {
		add("ratio_jobs_to_raw_consume_ack", "jobs/s ÷ consume+ack/s", v("jobs_per_s"), v("raw_consume_ack_per_s"), "")
	}
	if has("submit_complete_p50_ms", "raw_sync_publish_p50_ms") {
		add("ratio_submit_complete_p50_to_sync_publish_p50", "submit→complete p50 ÷ sync publish p50", v("submit_complete_p50_ms"), v("raw_sync_publish_p50_ms"),
			"how many sequential round trips one job costs")
	}
	if has("submit_dispatch_p99_ms", "raw_sync_publish_p99_ms") {
		add("ratio_submit_dispatch_p99_to_sync_publish_p99", "submit→dispatch p99 (half load) ÷ sync publish p99", v("submit_dispatch_p99_ms"), v("raw_sync_publish_p99_ms"), "")
	}
	if has("submit_dispatch_p99_ms", "raw_job_pipeline_half_dispatch_p99_ms") {
		add("ratio_submit_dispatch_p99_to_pipeline_half", "submit→dispatch p99 (half load) ÷ the pipeline's at the same rate", v("submit_dispatch_p99_ms"), v("raw_job_pipeline_half_dispatch_p99_ms"),
			"1 would be the broker's own tail at this rate on this machine, with clients that do no work")
	}
	if has("tasks_per_s_100_agents", "raw_consume_ack_per_s") {
		add("ratio_tasks_100_agents_to_raw_consume_ack", "targeted tasks/s (100 agents) ÷ consume+ack/s", v("tasks_per_s_100_agents"), v("raw_consume_ack_per_s"), "")
	}
	if has("fanout_1000_s", "raw_async_publish_per_s") {
		add("ratio_fanout_1000_steps_to_raw_async_publish", "fan-out steps/s ÷ async publish/s", 1000/max(v("fanout_1000_s"), 1e-9), v("raw_async_publish_per_s"), "")
	}
}

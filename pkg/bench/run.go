package bench

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Run runs the selected phases and returns the report. A phase that fails
// is noted and the others still run.
func Run(cfg Config) (*Report, error) {
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
	needProcs := slices.ContainsFunc(cfg.Only, func(p string) bool { return p == "failover" || p == "scale" || p == "memory" })
	if err := e.prepare(needProcs); err != nil {
		return nil, err
	}
	start := time.Now()
	for _, p := range Phases {
		if !slices.Contains(cfg.Only, p) {
			continue
		}
		e.logf("=== phase %s", p)
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
	case "throughput":
		e.runThroughput(tb)
	case "latency":
		e.runLatency(tb)
	case "failover":
		e.runFailover(tb)
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
	if jps, ok := r.Value("jobs_per_s"); ok {
		if a, ok := r.Value("raw_async_publish_per_s"); ok && a > 0 {
			r.Add(Figure{Section: sec, Key: "ratio_jobs_to_raw_async_publish", Label: "jobs/s ÷ async publish/s", Value: jps / a, Unit: "x"})
		}
		if s, ok := r.Value("raw_sync_publish_per_s"); ok && s > 0 {
			r.Add(Figure{Section: sec, Key: "ratio_jobs_to_raw_sync_publish", Label: "jobs/s ÷ sync publish/s", Value: jps / s, Unit: "x"})
			if w, ok := r.Value("writes_per_job"); ok {
				r.Add(Figure{Section: sec, Key: "ratio_job_writes_to_raw_sync_publish", Label: "job writes/s ÷ sync publish/s", Value: jps * w / s, Unit: "x",
					Note: "above 1: Warden pipelines writes; below: round trips bound it"})
			}
		}
		if c, ok := r.Value("raw_consume_ack_per_s"); ok && c > 0 {
			r.Add(Figure{Section: sec, Key: "ratio_jobs_to_raw_consume_ack", Label: "jobs/s ÷ consume+ack/s", Value: jps / c, Unit: "x"})
		}
	}
	if p, ok := r.Value("submit_complete_p50_ms"); ok {
		if s, ok := r.Value("raw_sync_publish_per_s"); ok && s > 0 {
			rt := 1000 / s
			r.Add(Figure{Section: sec, Key: "ratio_submit_complete_p50_to_sync_publish", Label: "submit→complete p50 ÷ sync publish time", Value: p / rt, Unit: "x",
				Note: "how many sequential round trips one job costs"})
		}
	}
}

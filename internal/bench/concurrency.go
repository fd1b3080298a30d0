package bench

import (
	"encoding/json"
	"fmt"
	"time"
)

// runConcurrency measures single-step jobs that share one concurrency key
// (`concurrency: {key, limit}` on the job: at most limit of them run at
// once, system-wide): jobs kept in flight for a fixed time, as in the
// throughput phase, with the writes the key costs counted.
func (e *Env) runConcurrency(tb *runTB) {
	const sec = "concurrency keys"
	const limit = 64
	d := e.deploy(tb, 8, 64, nil)
	spec, _ := json.Marshal(map[string]any{"name": "keyed", "concurrency": map[string]any{"key": "bench-key", "limit": limit},
		"steps": []any{map[string]any{"id": "s", "action": "noop"}}})
	d.runJobs(tb, "warm", 100, 2, func(int) []byte { return spec }, time.Minute)

	inFlight := pick(e, 1000, 500)
	dur := pick(e, 8*time.Second, 4*time.Second)
	before := streamSeqs(tb, d.js)
	base := d.track.Count()
	submitted, done, el := d.keepInFlight(tb, "keyed", spec, inFlight, dur)
	if !d.track.waitCount(base+submitted, 2*time.Minute) {
		tb.Fatalf("only %d of %d keyed jobs finished", d.track.Count()-base, submitted)
	}
	time.Sleep(200 * time.Millisecond)
	writes, by := writesBetween(before, streamSeqs(tb, d.js))
	jps := float64(done) / el.Seconds()
	e.rep.Add(Figure{Section: sec, Key: "concurrency_key_jobs_per_s", Label: fmt.Sprintf("single-step jobs sharing one key (limit %d)", limit), Value: jps, Unit: "jobs/s",
		Note: fmt.Sprintf("%d in flight for %s (%d finished), 8 SDK agents × 64", inFlight, dur, done)})
	e.rep.Add(Figure{Section: sec, Key: "concurrency_key_writes_per_job", Label: "JetStream writes per keyed job", Value: float64(writes) / float64(submitted), Unit: "writes",
		Note: perJob(by, submitted)})
	if f := d.track.failures(); f > 0 {
		e.rep.Note("concurrency: %d keyed jobs did not succeed", f)
	}
	if all, ok := e.rep.Value("jobs_per_s"); ok && all > 0 {
		e.rep.Add(Figure{Section: sec, Key: "ratio_concurrency_key_to_jobs_per_s", Label: "keyed jobs/s ÷ jobs/s", Value: jps / all, Unit: "x"})
	}
	e.logf("concurrency: %.0f keyed jobs/s, %s", jps, perJob(by, submitted))
}

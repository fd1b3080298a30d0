package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/spec"
)

// runDAG measures large jobs, each in a fresh deployment so that a job
// which outlives its bound does not disturb the next measurement:
//
//   - a fan-out of 1,000 independent steps, submit to the job's terminal
//     record (fanout_1000_s);
//   - a chain of 100 sequential steps (chain_100_s);
//   - single-step probe jobs submitted one at a time while a 1,000-step
//     job runs (probe_p99_during_fanout_ms), against probes on the same
//     deployment before it (probe_idle_p99_ms);
//   - the cancel of a running 1,000-step job (steps that block until
//     cancelled), from ops.CancelJob — what `warden job cancel` calls — to
//     every step terminal (cancel_1000_s).
func (e *Env) runDAG(tb *runTB) {
	steps := e.cfg.DAGSteps
	if steps <= 0 {
		steps = 1000
	}
	chain := e.cfg.ChainSteps
	if chain <= 0 {
		chain = 100
	}
	if most := spec.DefaultLimits.MaxSteps; steps > most || chain > most {
		// The scheduler refuses the submission (too_large), so the job
		// would never have a record to wait for.
		tb.Fatalf("--dag-steps %d / --chain-steps %d: the scheduler (max_steps %d by default) refuses jobs of more steps", steps, chain, most)
	}
	bound := pick(e, 2*time.Minute, time.Minute)
	e.sub("dag-fanout", func(tb *runTB) { e.dagFanout(tb, steps, bound) })
	e.sub("dag-chain", func(tb *runTB) { e.dagChain(tb, chain, bound) })
	e.sub("dag-probe", func(tb *runTB) { e.dagProbes(tb, steps, bound) })
	e.sub("dag-cancel", func(tb *runTB) { e.dagCancel(tb, steps, bound) })
}

// sub runs one measurement with its own cleanups; a failure is noted and
// the phase goes on.
func (e *Env) sub(name string, f func(*runTB)) {
	tb := newTB(name, e.logf)
	defer tb.Close()
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(fatalError)
			if !ok {
				panic(r)
			}
			e.logf("%s failed: %v", name, fe)
			e.rep.Note("%s failed: %v", name, fe)
		}
	}()
	f(tb)
}

// submitWait submits one job (waiting for its PubAck) and waits until its
// record is terminal; ok is false if that took longer than bound.
func (d *deployment) submitWait(tb *runTB, id string, spec []byte, bound time.Duration) (time.Duration, bool) {
	done := d.track.wait(id)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	if _, err := d.js.PublishMsg(ctx, submission(id, spec)); err != nil {
		tb.Fatalf("submit %s: %v", id, err)
	}
	select {
	case <-done:
		at, _ := d.track.at(id)
		return at.Sub(t0), true
	case <-time.After(bound):
		return bound, false
	}
}

// cancelSteps reads a job's step records, each read bounded by 10 s.
func cancelSteps(ctx context.Context, store *jobstore.Store, id string) ([]jobstore.VersionedStep, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	snap, err := store.Load(rctx, id) // the job and its steps, one read
	if err != nil {
		return nil, fmt.Errorf("read job: %w", err)
	}
	return snap.Versioned(), nil
}

// bounded records a duration figure that may have hit its bound.
func (e *Env) bounded(f Figure, el time.Duration, ok bool, bound time.Duration, goal float64) {
	f.Value = el.Seconds()
	if !ok {
		f.Note = fmt.Sprintf("NOT FINISHED within %s (value is the bound); ", bound) + f.Note
	}
	f = atMost(f, goal, f.Unit)
	if !ok {
		f.Met = "no"
	}
	e.rep.Add(f)
}

func (e *Env) dagFanout(tb *runTB, steps int, bound time.Duration) {
	d := e.deploy(tb, 8, 64, nil)
	el, ok := d.submitWait(tb, "fanout", fanoutSpec(steps), bound)
	e.bounded(Figure{Section: "large jobs", Key: fmt.Sprintf("fanout_%d_s", steps), Label: fmt.Sprintf("fan-out of %d steps", steps), Unit: "s",
		Note: fmt.Sprintf("one job, %d independent no-op steps, 8 agents × 64 slots; submit to terminal record", steps)}, el, ok, bound, 2)
	e.logf("dag: fan-out of %d in %s (finished %v)", steps, el.Round(time.Millisecond), ok)
}

func (e *Env) dagChain(tb *runTB, n int, bound time.Duration) {
	d := e.deploy(tb, 8, 64, nil)
	el, ok := d.submitWait(tb, "chain", chainSpec(n), bound)
	e.bounded(Figure{Section: "large jobs", Key: fmt.Sprintf("chain_%d_s", n), Label: fmt.Sprintf("chain of %d steps", n), Unit: "s",
		Note: fmt.Sprintf("one job, %d sequential no-op steps; submit to terminal record", n)}, el, ok, bound, 1)
	e.logf("dag: chain of %d in %s (finished %v)", n, el.Round(time.Millisecond), ok)
}

// dagProbes times single-step jobs one at a time, first on an idle
// deployment, then while a large fan-out runs.
func (e *Env) dagProbes(tb *runTB, steps int, bound time.Duration) {
	const sec = "large jobs"
	var mu sync.Mutex
	handled := map[string]time.Time{} // probe job -> its handler started
	d := e.deploy(tb, 8, 64, func(job string, at time.Time) {
		if strings.HasPrefix(job, "probe-") {
			mu.Lock()
			handled[job] = at
			mu.Unlock()
		}
	})
	probe := singleStepSpec("noop", "")
	perProbe := 30 * time.Second
	var idle []time.Duration
	for i := range pick(e, 100, 40) {
		el, ok := d.submitWait(tb, fmt.Sprintf("idle-%d", i), probe, perProbe)
		if !ok {
			tb.Fatalf("idle probe %d did not finish within %s", i, perProbe)
		}
		idle = append(idle, el)
	}
	idleP99 := percentile(idle, 99)
	e.rep.Add(Figure{Section: sec, Key: "probe_idle_p99_ms", Label: "single-step probe p99, idle", Value: ms(idleP99), Unit: "ms",
		Note: fmt.Sprintf("%d probes one at a time before the fan-out, same deployment; p50 %.2f ms", len(idle), ms(percentile(idle, 50)))})

	// Rounds: a fan-out, and probes one after another until it finishes;
	// only probes submitted while it ran count. A fast fan-out leaves
	// few probes per round, so rounds repeat until there are enough.
	type probeRun struct {
		id string
		at time.Time
		el time.Duration
	}
	var during, toHandler []time.Duration
	stuck, bigDone := false, true
	rounds := 0
	want := pick(e, 200, 50)
	start := time.Now()
	for n := 0; len(during) < want && rounds < 20 && !stuck && time.Since(start) < bound; rounds++ {
		bigID := fmt.Sprintf("big-%d", rounds)
		big := d.track.wait(bigID)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := d.js.PublishMsg(ctx, submission(bigID, fanoutSpec(steps)))
		cancel()
		if err != nil {
			tb.Fatalf("submit: %v", err)
		}
		var runs []probeRun
	probes:
		for time.Since(start) < bound {
			select {
			case <-big:
				break probes
			default:
			}
			id := fmt.Sprintf("probe-%d", n)
			n++
			t := time.Now()
			el, ok := d.submitWait(tb, id, probe, perProbe)
			runs = append(runs, probeRun{id, t, el})
			if !ok {
				stuck = true
				break
			}
		}
		bigAt, done := d.track.at(bigID)
		bigDone = bigDone && done
		mu.Lock()
		for _, r := range runs {
			if !done || r.at.Before(bigAt) {
				during = append(during, r.el)
				if h, ok := handled[r.id]; ok {
					toHandler = append(toHandler, h.Sub(r.at))
				}
			}
		}
		mu.Unlock()
	}
	goal, base := 3*ms(idleP99), "probe_idle_p99_ms"
	if low, ok := e.rep.Value("submit_complete_low_p99_ms"); ok {
		goal, base = 3*low, "submit_complete_low_p99_ms"
	}
	p99 := percentile(during, 99)
	note := fmt.Sprintf("%d probes one at a time while %d-step fan-outs ran (%d rounds, every fan-out finished: %v); p50 %.2f ms, max %.2f ms; target 3 × %s",
		len(during), steps, rounds, bigDone, ms(percentile(during, 50)), ms(percentile(during, 100)), base)
	if stuck {
		note = fmt.Sprintf("a probe did not finish within %s (counted as %s); ", perProbe, perProbe) + note
	}
	e.rep.Add(atMost(Figure{Section: sec, Key: "probe_p99_during_fanout_ms", Label: "single-step probe p99 during a fan-out", Value: ms(p99), Unit: "ms",
		Note: note}, goal, "ms"))
	e.rep.Add(Figure{Section: sec, Key: "probe_dispatch_p99_during_fanout_ms", Label: "probe submit→handler start p99 during a fan-out", Value: ms(percentile(toHandler, 99)), Unit: "ms",
		Note: "the part of a probe's time before an agent runs it (the fan-out takes every agent slot, 8 × 64); the rest is the result's way to the job record"})
	if idleP99 > 0 {
		e.rep.Add(Figure{Section: sec, Key: "probe_during_fanout_to_idle_p99", Label: "probe p99 during fan-out ÷ idle", Value: float64(p99) / float64(idleP99), Unit: "x"})
	}
	e.logf("dag: probes during fan-out p99 %.2f ms (idle %.2f ms), %d probes", ms(p99), ms(idleP99), len(during))
}

// dagCancel cancels a running job whose steps block until cancelled.
func (e *Env) dagCancel(tb *runTB, steps int, bound time.Duration) {
	var started atomic.Int64
	d := e.deploy(tb, 8, 64, func(job string, _ time.Time) {
		if job == "victim" {
			started.Add(1)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	done := d.track.wait("victim")
	if _, err := d.js.PublishMsg(ctx, submission("victim", fanoutSpecAction(steps, "hold"))); err != nil {
		tb.Fatalf("submit: %v", err)
	}
	// Running: as many steps started as the agents take (8 × 64), or, once
	// enough started, as many as started before the count stayed still for
	// a second. One job holds at most max_job_share (default 0.5) of the
	// slots, so 256 start: waiting for 512 cost every run the whole bound,
	// two minutes. Enough is a tenth of the steps, at least one and at
	// most a quarter of the slots, so that any --dag-steps gets there.
	want := int64(min(steps, 8*64))
	enough := max(1, min(int64(steps/10), 8*64/4))
	t0 := time.Now()
	last, still := started.Load(), time.Now()
	for n := last; n < want; n = started.Load() {
		if n != last {
			last, still = n, time.Now()
		}
		if n >= enough && time.Since(still) > time.Second {
			break
		}
		if time.Since(t0) > 2*bound {
			tb.Fatalf("only %d of %d steps started within %s", n, want, 2*bound)
		}
		time.Sleep(10 * time.Millisecond)
	}
	running := started.Load()
	store, err := jobstore.Open(ctx, d.js)
	if err != nil {
		tb.Fatalf("store: %v", err)
	}
	o := ops.New(d.nc, store)
	t1 := time.Now()
	rep, err := o.CancelJob(ctx, "victim")
	if err != nil {
		tb.Fatalf("cancel: %v", err)
	}
	call := time.Since(t1)
	ok := true
	select {
	case <-done:
	case <-time.After(bound):
		ok = false
	}
	// Every step terminal (the job's record says so first; check the
	// steps): all steps' records read, each in a terminal state. A failed
	// read (a timeout on a busy machine) proves nothing: it is read again
	// until the bound, never taken as done.
	left, readErrs := -1, 0
	var lastErr error
	for ok {
		sts, err := cancelSteps(ctx, store, "victim")
		if err == nil {
			left = steps - len(sts) // steps without a record are not terminal
			for _, st := range sts {
				if !st.State.Terminal() {
					left++
				}
			}
		} else {
			readErrs++
			lastErr = err
		}
		if (err == nil && left == 0) || time.Since(t1) > bound {
			ok = err == nil && left == 0
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if readErrs > 0 {
		e.logf("dag: cancel check: %d step reads failed (last: %v), read again", readErrs, lastErr)
	}
	el := time.Since(t1)
	if !ok {
		el = bound
	}
	e.bounded(Figure{Section: "large jobs", Key: fmt.Sprintf("cancel_%d_s", steps), Label: fmt.Sprintf("cancel of a running %d-step job", steps), Unit: "s",
		Note: fmt.Sprintf("ops.CancelJob with %d steps running, to every step's record read back terminal; the call itself %.2f s (cancelled %d, interrupted %d, unreached %d)",
			running, call.Seconds(), len(rep.Cancelled), len(rep.Interrupted), len(rep.Unreached))}, el, ok, bound, 2)
	e.logf("dag: cancel of %d steps (%d running) in %s (call %s, finished %v, %d left)", steps, running, el.Round(time.Millisecond), call.Round(time.Millisecond), ok, left)
}

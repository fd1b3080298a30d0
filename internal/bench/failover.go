package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/lease"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/procs"
)

var holdingRE = regexp.MustCompile(`BENCH-HOLDING (\S+) (\S+)`)

// runFailover kills agents holding steps and the supervisor leader, with
// real processes (built by test/procs) and default settings: presence TTL
// 3s, failure threshold 1s, lease TTL 5s.
//
// Trials run in parallel: every victim agent (max_concurrent 1) holds one
// step of its own job; victims are killed with SIGKILL in staggered groups
// of four, 250 ms apart, so the supervisor handles several failovers at
// different moments. Each step's failover time is from its agent's kill to
// its job's terminal record (one step per job).
func (e *Env) runFailover(tb *runTB) {
	const sec = "failover (real processes)"
	srv := e.startServer(tb)
	e.schedulerProc(tb, srv.URL, 4)
	sup1 := e.supervisorProc(tb, srv.URL, "sup-1", 4)
	sup1.WaitOutput(tb, "leading:", 30*time.Second)
	_, js := connect(tb, srv.URL, "bench-failover")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	trials := e.cfg.FailoverTrials
	if trials <= 0 {
		trials = pick(e, 24, 8)
	}
	victims := map[string]*procs.Proc{}
	for i := 0; i < trials; i++ {
		id := fmt.Sprintf("victim-%d", i)
		victims[id] = procs.Start(tb, id, e.self, "agent", "--server", srv.URL, "--id", id, "--pool", "fo", "--max-concurrent", "1")
	}
	for _, p := range victims {
		p.WaitOutput(tb, "agent ready", 60*time.Second)
	}
	// When each job ends, from its record in the job store (one step per
	// job: the job ends when its step does).
	track := newTracker(tb, js)
	spec := singleStepSpec("hold", "")
	spec = []byte(strings.Replace(string(spec), `"action":"hold"`, `"action":"hold","pool":"fo"`, 1))
	for i := 0; i < trials; i++ {
		if _, err := js.PublishMsg(ctx, submission(fmt.Sprintf("fo-%d", i), spec)); err != nil {
			tb.Fatalf("submit: %v", err)
		}
	}
	// Wait until every step is held by a victim.
	holder := map[string]string{} // job -> victim
	deadline := time.Now().Add(60 * time.Second)
	for len(holder) < trials {
		for _, p := range victims {
			for _, m := range holdingRE.FindAllStringSubmatch(p.Output(), -1) {
				holder[m[1]] = m[2]
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("only %d of %d steps are held by victims", len(holder), trials)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Survivors join only now, so that no step started on them.
	var survivors []*procs.Proc
	for i := 0; i < 2; i++ {
		id := fmt.Sprintf("survivor-%d", i)
		p := procs.Start(tb, id, e.self, "agent", "--server", srv.URL, "--id", id, "--pool", "fo", "--max-concurrent", "64")
		survivors = append(survivors, p)
	}
	for _, p := range survivors {
		p.WaitOutput(tb, "agent ready", 60*time.Second)
	}
	time.Sleep(1500 * time.Millisecond) // a heartbeat or two: the scheduler and supervisor see them
	killed := map[string]time.Time{}
	ids := make([]string, 0, len(victims))
	for i := 0; i < trials; i++ {
		ids = append(ids, fmt.Sprintf("victim-%d", i))
	}
	for g := 0; g < len(ids); g += 4 {
		for _, id := range ids[g:min(g+4, len(ids))] {
			killed[id] = time.Now()
			victims[id].Kill()
		}
		time.Sleep(250 * time.Millisecond)
	}
	var times []time.Duration
	deadline = time.Now().Add(60 * time.Second)
	track.waitCount(trials, time.Until(deadline))
	for job, victim := range holder {
		if at, ok := track.at(job); ok {
			times = append(times, at.Sub(killed[victim]))
		}
	}
	if f := track.failures(); f > 0 {
		e.rep.Note("failover: %d jobs whose agent was killed did not succeed", f)
	}
	if len(times) == 0 {
		tb.Fatalf("no killed step completed elsewhere within 60s")
	}
	if len(times) < trials {
		e.rep.Note("failover: only %d of %d killed steps completed elsewhere within 60s", len(times), trials)
	}
	e.rep.Add(atMost(Figure{Section: sec, Key: "agent_failover_p99_s", Label: "killed agent's step done elsewhere, p99", Value: percentile(times, 99).Seconds(), Unit: "s",
		Note: fmt.Sprintf("%d trials: SIGKILL in groups of 4, 250 ms apart; presence TTL 3s, failure threshold 1s", len(times))}, 5, "s"))
	e.rep.Add(Figure{Section: sec, Key: "agent_failover_p50_s", Label: "killed agent's step done elsewhere, p50", Value: percentile(times, 50).Seconds(), Unit: "s"})
	e.rep.Add(Figure{Section: sec, Key: "agent_failover_max_s", Label: "killed agent's step done elsewhere, max", Value: percentile(times, 100).Seconds(), Unit: "s"})
	e.rep.Set("agent_failover_trials", len(times))
	e.logf("failover: p50 %s p99 %s over %d trials", percentile(times, 50), percentile(times, 99), len(times))

	e.runTakeover(tb, srv.URL, js, sup1)
}

// runTakeover kills the supervisor leader and times the standby: until it
// holds the lease, and until its leader loops run ("leading:" in its log).
func (e *Env) runTakeover(tb *runTB, url string, js jetstream.JetStream, leader *procs.Proc) {
	const sec = "failover (real processes)"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	kv, err := js.KeyValue(ctx, protocol.BucketLeases)
	if err != nil {
		tb.Fatalf("leases bucket: %v", err)
	}
	trials := e.cfg.TakeoverTrials
	if trials <= 0 {
		trials = pick(e, 3, 1)
	}
	ttl := supervisor.DefaultConfig().LeaseTTL.Std()
	var acted, leased []time.Duration
	for i := 0; i < trials; i++ {
		id := fmt.Sprintf("sup-%d", i+2)
		standby := e.supervisorProc(tb, url, id, 4)
		standby.WaitOutput(tb, "standing by", 30*time.Second)
		w, err := kv.Watch(ctx, supervisor.LeaseKey, jetstream.UpdatesOnly())
		if err != nil {
			tb.Fatalf("watch lease: %v", err)
		}
		// Kill at a random point of the renewal cycle: the trial index
		// spreads the kills over it.
		time.Sleep(time.Duration(i) * 1100 * time.Millisecond)
		t0 := time.Now()
		leader.Kill()
		var tLease time.Duration
		for tLease == 0 {
			select {
			case u := <-w.Updates():
				if u == nil || u.Operation() != jetstream.KeyValuePut {
					continue
				}
				var h lease.Holder
				if json.Unmarshal(u.Value(), &h) == nil && h.ID == id {
					tLease = time.Since(t0)
				}
			case <-time.After(3 * ttl):
				tb.Fatalf("standby %s did not take the lease within %s", id, 3*ttl)
			}
		}
		_ = w.Stop()
		deadline := time.Now().Add(3 * ttl)
		for !strings.Contains(standby.Output(), "leading:") {
			if time.Now().After(deadline) {
				tb.Fatalf("standby %s did not start leading", id)
			}
			time.Sleep(5 * time.Millisecond)
		}
		acted = append(acted, time.Since(t0))
		leased = append(leased, tLease)
		e.logf("takeover %d: lease after %s, leading after %s", i+1, tLease, acted[len(acted)-1])
		leader = standby
	}
	e.rep.Add(atMost(Figure{Section: sec, Key: "supervisor_takeover_s", Label: "supervisor leader killed → standby acts (max)", Value: percentile(acted, 100).Seconds(), Unit: "s",
		Note: fmt.Sprintf("%d trials, lease TTL %s, renewed every 0.75×TTL; until the standby's loops run", trials, ttl)}, (ttl + time.Second).Seconds(), "s"))
	e.rep.Add(Figure{Section: sec, Key: "supervisor_takeover_lease_s", Label: "standby holds the lease (max)", Value: percentile(leased, 100).Seconds(), Unit: "s"})
	e.rep.Add(Figure{Section: sec, Key: "supervisor_takeover_p50_s", Label: "standby acts, median", Value: percentile(acted, 50).Seconds(), Unit: "s"})
}

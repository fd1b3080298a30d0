package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
	"github.com/wardenhq/warden/test/procs"
)

// runCluster measures the failover of an active-passive agent cluster with
// real processes (scheduler, supervisor, three cmd/agent members, default
// settings): single-step jobs naming the cluster are submitted every 50 ms;
// the leader is killed with SIGKILL; a trial is the time from the kill to
// the terminal record of the first job submitted after it. The killed
// member is restarted (it rejoins as a standby) before the next trial.
func (e *Env) runCluster(tb *runTB) {
	const sec = "cluster failover (real processes)"
	const name = "bench-ap"
	srv := e.startServer(tb)
	_, js := connect(tb, srv.URL, "bench-cluster")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		tb.Fatalf("streams: %v", err)
	}
	st, err := cluster.Open(ctx, js)
	if err != nil {
		tb.Fatalf("clusters: %v", err)
	}
	if _, err := st.Create(ctx, protocol.ClusterDefinition{Name: name, Mode: protocol.ModeActivePassive,
		TargetGroup: protocol.TargetGroup{Name: name + "-targets"},
		Membership:  protocol.ClusterMembership{Minimum: 1, Desired: 3}}); err != nil {
		tb.Fatalf("define cluster: %v", err)
	}
	e.schedulerProc(tb, srv.URL, streams.DefaultTaskShards)
	e.supervisorProc(tb, srv.URL, "sup-cluster", streams.DefaultTaskShards)
	members := map[string]*procs.Proc{}
	start := func(id string) {
		members[id] = procs.Start(tb, id, e.bins["agent"], "--server", srv.URL, "--id", id, "--pool", "p",
			"--cluster", name, "--max-concurrent", "8")
	}
	for _, id := range []string{"m1", "m2", "m3"} {
		start(id)
	}
	track := newTracker(tb, js)
	leader := func(within time.Duration) string {
		deadline := time.Now().Add(within)
		var roles []string // what the cluster looked like last, for the failure message
		for time.Now().Before(deadline) {
			s, _, err := st.State(ctx, name)
			standbys := 0
			roles = roles[:0]
			for _, m := range s.Members {
				if m.Role == protocol.RoleStandby {
					standbys++
				}
				roles = append(roles, fmt.Sprintf("%s=%s %s", m.Key, m.Role, m.Reason))
			}
			if err == nil && s.Leader != "" && standbys == 2 {
				return strings.TrimPrefix(s.Leader, "p.")
			}
			time.Sleep(50 * time.Millisecond)
		}
		tb.Fatalf("cluster %s is not one leader and two standbys after %s: %v", name, within, roles)
		return ""
	}
	leader(60 * time.Second)

	// A steady stream of cluster jobs.
	spec, _ := json.Marshal(map[string]any{"name": "c", "steps": []any{map[string]any{"id": "s", "action": "echo", "cluster": name,
		"params": map[string]any{"message": "hi"}}}})
	var mu sync.Mutex
	var sent []submitted
	sctx, stopSubmit := context.WithCancel(ctx)
	defer stopSubmit()
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
			id := fmt.Sprintf("cl-%d", i)
			at := time.Now()
			if _, err := publishAsync(js, submission(id, spec)); err != nil {
				continue
			}
			mu.Lock()
			sent = append(sent, submitted{id, at})
			mu.Unlock()
		}
	}()

	trials := pick(e, 5, 2)
	var times []time.Duration
	for i := range trials {
		victim := leader(60 * time.Second)
		time.Sleep(time.Second) // jobs flow through this leader
		members[victim].Kill()
		killed := time.Now()
		var took time.Duration
		for took == 0 {
			if time.Since(killed) > time.Minute {
				tb.Fatalf("trial %d: no job submitted after the leader's kill finished within a minute", i+1)
			}
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			for _, s := range sent {
				if s.at.After(killed) {
					if at, ok := track.at(s.id); ok && (took == 0 || at.Sub(killed) < took) {
						took = at.Sub(killed)
					}
				}
			}
			mu.Unlock()
		}
		times = append(times, took)
		e.logf("cluster: trial %d: leader %s killed, first job after it done in %s", i+1, victim, took.Round(time.Millisecond))
		start(victim) // rejoins as a standby
	}
	stopSubmit()
	if f := track.failures(); f > 0 {
		e.rep.Note("cluster: %d cluster jobs did not succeed", f)
	}
	e.rep.Add(atMost(Figure{Section: sec, Key: "cluster_failover_p99_s", Label: "cluster leader killed → a new job done, p99", Value: percentile(times, 99).Seconds(), Unit: "s",
		Note: fmt.Sprintf("%d trials, active_passive, 3 agent processes, SIGKILL of the leader; target as for an agent's failover", len(times))}, 5, "s"))
	e.rep.Add(Figure{Section: sec, Key: "cluster_failover_p50_s", Label: "cluster leader killed → a new job done, p50", Value: percentile(times, 50).Seconds(), Unit: "s"})
}

// submitted is a job and when it was submitted.
type submitted struct {
	id string
	at time.Time
}

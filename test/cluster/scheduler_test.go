package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/procs"
)

// submitter submits one-step cluster jobs at a steady rate and remembers
// when each was submitted.
type submitter struct {
	mu   sync.Mutex
	jobs []submitted
}

type submitted struct {
	id string
	at time.Time
}

func (s *submitter) run(ctx context.Context, t *testing.T, url string, every time.Duration, stepYAML func(i int) string) {
	c, err := client.Connect(url, client.Options{Name: "cluster-e2e"})
	if err != nil {
		t.Error(err)
		return
	}
	go func() {
		defer c.Close()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			spec := fmt.Sprintf("name: c%d\nsteps:\n  - %s\n", i, stepYAML(i))
			at := time.Now()
			r, err := c.Submit(ctx, []byte(spec), client.SubmitOptions{NoReply: true})
			if err != nil {
				continue
			}
			s.mu.Lock()
			s.jobs = append(s.jobs, submitted{id: r.JobID, at: at})
			s.mu.Unlock()
		}
	}()
}

func (s *submitter) list() []submitted {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]submitted(nil), s.jobs...)
}

// steps reads the step "s" of every job submitted so far.
func steps(t *testing.T, st *jobstore.Store, jobs []submitted) map[string]*jobstore.Step {
	out := map[string]*jobstore.Step{}
	for _, j := range jobs {
		s, _, err := st.Step(context.Background(), j.id, "s")
		if err == nil {
			out[j.id] = s
		} else if !errors.Is(err, jobstore.ErrNotFound) {
			t.Logf("read %s: %v", j.id, err)
		}
	}
	return out
}

// TestSchedulerRoutesThroughActivePassiveCluster runs the real scheduler
// and supervisor: steps name `cluster: ap`; the leader is killed with -9.
func TestSchedulerRoutesThroughActivePassiveCluster(t *testing.T) {
	t.Parallel()
	h := newHarness(t, definition("apx", protocol.ModeActivePassive), true)
	procs.Start(t, "scheduler", schedulerBin, "--server", h.srv.URL)
	procs.Start(t, "supervisor", supervisorBin, "--server", h.srv.URL)
	for _, id := range []string{"a", "b", "c"} {
		h.start(id)
	}
	first := waitLeader(t, h, 2)
	st, err := jobstore.Open(context.Background(), h.js)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sub submitter
	sub.run(ctx, t, h.srv.URL, 200*time.Millisecond, func(int) string {
		return `{id: s, action: echo, cluster: apx, params: {message: hi}}`
	})
	natstest.Eventually(t, 60*time.Second, "cluster steps succeed on the leader", func() bool {
		n := 0
		for _, s := range steps(t, st, sub.list()) {
			if s.State == jobstore.StepSucceeded {
				if s.Actor != strings.TrimPrefix(first.Leader, "p.") || s.ClusterEpoch != first.Epoch {
					t.Fatalf("step ran on %s under cluster epoch %d; leader %s epoch %d", s.Actor, s.ClusterEpoch, first.Leader, first.Epoch)
				}
				n++
			}
		}
		return n >= 5
	})

	leaderID := strings.TrimPrefix(first.Leader, "p.")
	h.proc(leaderID).Kill()
	killed := time.Now()
	var took time.Duration
	var who string
	natstest.Eventually(t, 60*time.Second, "a job submitted after the kill succeeds on another member", func() bool {
		ss := steps(t, st, sub.list())
		for _, j := range sub.list() {
			s := ss[j.id]
			if j.at.After(killed) && s != nil && s.State == jobstore.StepSucceeded {
				took, who = s.FinishedAt.Sub(killed), s.Actor
				return true
			}
		}
		return false
	})
	second := h.state()
	t.Logf("scheduler + supervisor: leader %s killed (-9); first step submitted after it finished on %s %s after the kill; cluster epoch %d -> %d",
		first.Leader, who, took.Round(time.Millisecond), first.Epoch, second.Epoch)

	h.start(leaderID)
	natstest.Eventually(t, 30*time.Second, "restarted agent is a standby", func() bool { return roleOf(h.state(), leaderID) == protocol.RoleStandby })
	cancel()
	// Every job ends, those in the dead leader's hands included, and no two
	// members ran steps under one cluster epoch.
	jobs := sub.list()
	var byEpoch map[uint64]string
	natstest.Eventually(t, 90*time.Second, "every job succeeded", func() bool {
		byEpoch = map[uint64]string{}
		ss := steps(t, st, jobs)
		for _, j := range jobs {
			s := ss[j.id]
			if s == nil || s.State != jobstore.StepSucceeded {
				return false
			}
			if o, ok := byEpoch[s.ClusterEpoch]; ok && o != s.Actor {
				t.Fatalf("cluster epoch %d: steps succeeded on %s and %s", s.ClusterEpoch, o, s.Actor)
			}
			byEpoch[s.ClusterEpoch] = s.Actor
		}
		return true
	})
	t.Logf("%d jobs succeeded; cluster epoch -> member: %v", len(jobs), byEpoch)
}

// TestSchedulerRoutesThroughShardedCluster: steps name `cluster: shx` and a
// target; a shard owner is killed with -9, restarted, and gets its shards back.
func TestSchedulerRoutesThroughShardedCluster(t *testing.T) {
	t.Parallel()
	var targets []string
	for i := range 12 {
		targets = append(targets, fmt.Sprintf("host-%02d", i))
	}
	h := newHarness(t, definition("shx", protocol.ModeSharded, targets...), true)
	procs.Start(t, "scheduler", schedulerBin, "--server", h.srv.URL)
	procs.Start(t, "supervisor", supervisorBin, "--server", h.srv.URL)
	for _, id := range []string{"a", "b", "c"} {
		h.start(id)
	}
	var first protocol.ClusterState
	natstest.Eventually(t, 30*time.Second, "three shard owners", func() bool {
		first = h.state()
		return len(first.Owners) == 3
	})
	st, err := jobstore.Open(context.Background(), h.js)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sub submitter
	sub.run(ctx, t, h.srv.URL, 100*time.Millisecond, func(i int) string {
		return fmt.Sprintf(`{id: s, action: echo, cluster: shx, target: %s, params: {message: hi}}`, targets[i%len(targets)])
	})
	natstest.Eventually(t, 60*time.Second, "steps succeed on their targets' owners", func() bool {
		n := 0
		for _, s := range steps(t, st, sub.list()) {
			if s.State == jobstore.StepSucceeded {
				n++
			}
		}
		return n >= 12
	})
	victim := "a"
	if first.Leader == "p.a" {
		victim = "b"
	}
	owned, _ := first.Member("p." + victim)
	h.proc(victim).Kill()
	killed := time.Now()
	var took time.Duration
	var who string
	natstest.Eventually(t, 60*time.Second, "a step for the victim's shard, submitted after the kill, succeeds on a survivor", func() bool {
		jobs := sub.list()
		ss := steps(t, st, jobs)
		for _, j := range jobs {
			s := ss[j.id]
			if j.at.After(killed) && s != nil && s.State == jobstore.StepSucceeded && strings.Contains(fmt.Sprint(owned.Targets), s.Target) {
				took, who = s.FinishedAt.Sub(killed), s.Actor
				return true
			}
		}
		return false
	})
	t.Logf("scheduler + supervisor, sharded: owner p.%s (%v) killed (-9); a step for one of its shards finished on %s %s after the kill",
		victim, owned.Targets, who, took.Round(time.Millisecond))
	h.start(victim)
	natstest.Eventually(t, 30*time.Second, "the owner gets its shards back", func() bool {
		m, _ := h.state().Member("p." + victim)
		return fmt.Sprint(m.Targets) == fmt.Sprint(owned.Targets)
	})
	back := time.Now()
	natstest.Eventually(t, 60*time.Second, "it runs its shards' steps again", func() bool {
		jobs := sub.list()
		ss := steps(t, st, jobs)
		for _, j := range jobs {
			if s := ss[j.id]; j.at.After(back) && s != nil && s.State == jobstore.StepSucceeded && s.Actor == victim {
				return true
			}
		}
		return false
	})
	cancel()
	jobs := sub.list()
	natstest.Eventually(t, 90*time.Second, "every job succeeded, one owner per target and epoch", func() bool {
		owner := map[string]string{}
		ss := steps(t, st, jobs)
		for _, j := range jobs {
			s := ss[j.id]
			if s == nil || s.State != jobstore.StepSucceeded {
				return false
			}
			k := fmt.Sprintf("%d/%s", s.ClusterEpoch, s.Target)
			if o, ok := owner[k]; ok && o != s.Actor {
				t.Fatalf("epoch/target %s: steps succeeded on %s and %s", k, o, s.Actor)
			}
			owner[k] = s.Actor
		}
		return true
	})
	t.Logf("%d jobs succeeded; never one target on two members under one epoch", len(jobs))
}

// TestSchedulerRoutesThroughActiveActiveCluster: steps name `cluster: aax`;
// the scheduler spreads them over the members by score; one is killed -9.
func TestSchedulerRoutesThroughActiveActiveCluster(t *testing.T) {
	t.Parallel()
	h := newHarness(t, definition("aax", protocol.ModeActiveActive), true)
	procs.Start(t, "scheduler", schedulerBin, "--server", h.srv.URL)
	procs.Start(t, "supervisor", supervisorBin, "--server", h.srv.URL)
	for _, id := range []string{"a", "b", "c"} {
		h.start(id)
	}
	natstest.Eventually(t, 30*time.Second, "three members", func() bool { return strings.Count(roles(h.state()), "=member") == 3 })
	st, err := jobstore.Open(context.Background(), h.js)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sub submitter
	sub.run(ctx, t, h.srv.URL, 100*time.Millisecond, func(int) string {
		return `{id: s, action: sleep, cluster: aax, params: {duration: 200ms}}`
	})
	ran := func(after time.Time) map[string]int {
		out := map[string]int{}
		jobs := sub.list()
		ss := steps(t, st, jobs)
		for _, j := range jobs {
			if s := ss[j.id]; j.at.After(after) && s != nil && s.State == jobstore.StepSucceeded {
				out[s.Actor]++
			}
		}
		return out
	}
	natstest.Eventually(t, 60*time.Second, "every member takes cluster steps", func() bool { return len(ran(time.Time{})) == 3 })
	t.Logf("before: steps per member %v", ran(time.Time{}))
	h.proc("c").Kill()
	killed := time.Now()
	natstest.Eventually(t, 60*time.Second, "steps submitted after the kill finish on the others", func() bool {
		r := ran(killed.Add(5 * time.Second))
		return r["a"]+r["b"] >= 5
	})
	after := ran(killed.Add(5 * time.Second))
	if after["c"] != 0 {
		t.Fatalf("the dead member completed steps: %v", after)
	}
	cancel()
	jobs := sub.list()
	natstest.Eventually(t, 90*time.Second, "every job succeeded", func() bool {
		ss := steps(t, st, jobs)
		for _, j := range jobs {
			if s := ss[j.id]; s == nil || s.State != jobstore.StepSucceeded {
				return false
			}
		}
		return true
	})
	t.Logf("active_active through the scheduler: c killed (-9); after it, steps per member %v; all %d jobs succeeded", after, len(jobs))
}

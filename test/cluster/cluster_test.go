package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Default settings: lease 3s, failure threshold 3s, sync every 2s.
func definition(name, mode string, targets ...string) protocol.ClusterDefinition {
	return protocol.ClusterDefinition{Name: name, Mode: mode, TargetGroup: protocol.TargetGroup{Name: name + "-targets", Targets: targets},
		Membership: protocol.ClusterMembership{Minimum: 1, Desired: 3}}
}

func waitLeader(t *testing.T, h *harness, standbys int) protocol.ClusterState {
	t.Helper()
	var st protocol.ClusterState
	natstest.Eventually(t, 30*time.Second, "a leader and its standbys", func() bool {
		st = h.state()
		return st.Leader != "" && roleOf(st, strings.TrimPrefix(st.Leader, "p.")) == protocol.RoleLeader &&
			strings.Count(fmt.Sprint(st.Members), protocol.RoleStandby) == standbys
	})
	return st
}

func TestActivePassiveKillLeader(t *testing.T) {
	t.Parallel()
	h := newHarness(t, definition("ap", protocol.ModeActivePassive, "h1", "h2"))
	for _, id := range []string{"a", "b", "c"} {
		h.start(id)
	}
	first := waitLeader(t, h, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.dispatch(ctx, 100*time.Millisecond, "echo", `{"message":"x"}`, nil)
	natstest.Eventually(t, 20*time.Second, "tasks complete on the leader", func() bool { return h.count(protocol.ResultSucceeded) >= 10 })

	leaderID := strings.TrimPrefix(first.Leader, "p.")
	h.proc(leaderID).Kill() // kill -9
	killed := time.Now()
	var at time.Time
	var who string
	natstest.Eventually(t, 20*time.Second, "work continues on another member", func() bool {
		var ok bool
		at, who, ok = h.firstSuccessAfter(killed, first.Leader)
		return ok
	})
	second := h.state()
	t.Logf("active_passive: leader %s killed (-9); first task completed on %s %s later; epoch %d -> %d; %s",
		first.Leader, who, at.Sub(killed).Round(time.Millisecond), first.Epoch, second.Epoch, roles(second))
	if second.Epoch <= first.Epoch {
		t.Fatalf("epoch %d -> %d", first.Epoch, second.Epoch)
	}
	// The killed agent restarts and comes back as a standby.
	h.start(leaderID)
	natstest.Eventually(t, 30*time.Second, "restarted leader is a standby", func() bool {
		return roleOf(h.state(), leaderID) == protocol.RoleStandby
	})
	// Leadership must not move back to the returned member. A move would
	// take it at most a lease (3s) to claim plus a sync (2s) to show in the
	// state, so the state is watched throughout a bounded negative window
	// of both and a margin, not looked at once. Tasks keep running meanwhile.
	const stayWindow = 3*time.Second + 2*time.Second + time.Second
	for end := time.Now().Add(stayWindow); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if st := h.state(); st.Leader != "" && st.Leader != second.Leader {
			t.Fatalf("leadership moved to %s when the old leader returned: %s", st.Leader, roles(st))
		}
	}
	cancel()
	n := h.checkFencing(false)
	st := h.state()
	t.Logf("after restart: %s (leader %s); %d tasks completed, never two members under one epoch", roles(st), st.Leader, n)
	if st.Leader != second.Leader {
		t.Fatalf("leadership moved to %s when the old leader returned", st.Leader)
	}
}

func roles(st protocol.ClusterState) string {
	var out []string
	for _, m := range st.Members {
		out = append(out, strings.TrimPrefix(m.Key, "p.")+"="+m.Role)
	}
	return strings.Join(out, " ")
}

func TestActivePassiveSplitBrain(t *testing.T) {
	t.Parallel()
	h := newHarness(t, definition("sb", protocol.ModeActivePassive))
	h.start("a")
	h.start("b")
	first := waitLeader(t, h, 1)
	leaderID := strings.TrimPrefix(first.Leader, "p.")
	old := h.proc(leaderID)
	// A long task in the leader's hands, under its epoch.
	job := h.publish(context.Background(), first.Leader, first.Epoch, "", "sleep", `{"duration":"6s"}`)
	natstest.Eventually(t, 10*time.Second, "the leader runs it", func() bool {
		r, ok := h.report(leaderID)
		return ok && r.InFlight > 0
	})

	if err := old.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	var second protocol.ClusterState
	natstest.Eventually(t, 20*time.Second, "the standby takes over", func() bool {
		second = h.state()
		return second.Leader != "" && second.Leader != first.Leader
	})
	t.Logf("leader %s stopped; %s leads %s later under epoch %d (was %d)", first.Leader, second.Leader,
		time.Since(stopped).Round(time.Millisecond), second.Epoch, first.Epoch)
	time.Sleep(time.Second)
	if err := old.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// It wakes up deposed: the finished task's result is withheld, and
	// the step is handed back for the new leader (a reroute refusal, as
	// for a task that came too late): no success under the old epoch, and
	// no step left waiting for its lease.
	old.WaitOutput(t, "withholding the result", 20*time.Second)
	natstest.Eventually(t, 10*time.Second, "the deposed leader hands the step back", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		r, ok := h.results[job]
		if ok && (r.Status != protocol.ResultFailed || r.ErrorClass != protocol.ClassReroute) {
			t.Fatalf("the deposed leader reported %s (class %q) for %s: %s", r.Status, r.ErrorClass, job, r.Error)
		}
		return ok
	})
	// It steps down and reports itself a standby; the new leader keeps leading.
	natstest.Eventually(t, 20*time.Second, "old leader steps down", func() bool {
		rep, ok := h.report(leaderID)
		return ok && rep.Role == protocol.RoleStandby && h.state().Leader == second.Leader
	})
	// A task still addressed to it under its old epoch is refused, not run.
	late := h.publish(context.Background(), first.Leader, first.Epoch, "", "echo", `{"message":"late"}`)
	natstest.Eventually(t, 20*time.Second, "late task refused", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		r, ok := h.results[late]
		return ok && r.Status == protocol.ResultFailed
	})
	h.mu.Lock()
	t.Logf("old leader after SIGCONT: result of %s withheld, handed back: %q; %s refused: %q", job, h.results[job].Error, late, h.results[late].Error)
	h.mu.Unlock()
}

func TestShardedKillOwner(t *testing.T) {
	t.Parallel()
	var targets []string
	for i := range 24 {
		targets = append(targets, fmt.Sprintf("host-%02d", i))
	}
	h := newHarness(t, definition("sh", protocol.ModeSharded, targets...))
	for _, id := range []string{"a", "b", "c"} {
		h.start(id)
	}
	var first protocol.ClusterState
	natstest.Eventually(t, 30*time.Second, "three shard owners", func() bool {
		first = h.state()
		return len(first.Owners) == 3
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.dispatch(ctx, 50*time.Millisecond, "echo", `{"message":"x"}`, targets)
	natstest.Eventually(t, 20*time.Second, "tasks complete", func() bool { return h.count(protocol.ResultSucceeded) >= 30 })

	victim := "a"
	if first.Leader == "p.a" {
		victim = "b"
	}
	owned, _ := first.Member("p." + victim)
	h.proc(victim).Kill()
	killed := time.Now()
	var moved time.Duration
	natstest.Eventually(t, 20*time.Second, "the victim's shards complete elsewhere", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		for job, r := range h.results {
			s := h.sent[job]
			if s.at.After(killed) && slices.Contains(owned.Targets, s.target) && r.Status == protocol.ResultSucceeded {
				moved = r.at.Sub(killed)
				return true
			}
		}
		return false
	})
	second := h.state()
	t.Logf("sharded: owner p.%s killed (-9) with %d shards; a shard of it completed on a survivor %s later; epoch %d -> %d; owners %v",
		victim, len(owned.Targets), moved.Round(time.Millisecond), first.Epoch, second.Epoch, second.Owners)

	h.start(victim)
	natstest.Eventually(t, 30*time.Second, "the restarted owner gets its shards back", func() bool {
		m, _ := h.state().Member("p." + victim)
		return fmt.Sprint(m.Targets) == fmt.Sprint(owned.Targets)
	})
	back := time.Now()
	natstest.Eventually(t, 20*time.Second, "it runs its shards again", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		for job, r := range h.results {
			if h.sent[job].at.After(back) && r.Agent == victim && r.Status == protocol.ResultSucceeded {
				return true
			}
		}
		return false
	})
	time.Sleep(time.Second)
	cancel()
	n := h.checkFencing(true)
	t.Logf("after rebalance: epoch %d, p.%s owns %v again; %d tasks completed, never one target by two members under one epoch",
		h.state().Epoch, victim, owned.Targets, n)
}

func TestActiveActiveKillMember(t *testing.T) {
	t.Parallel()
	h := newHarness(t, definition("aa", protocol.ModeActiveActive))
	for _, id := range []string{"a", "b", "c"} {
		h.start(id)
	}
	natstest.Eventually(t, 30*time.Second, "three members", func() bool {
		return strings.Count(roles(h.state()), "=member") == 3
	})
	first := h.state()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.dispatch(ctx, 50*time.Millisecond, "echo", `{"message":"x"}`, nil)
	natstest.Eventually(t, 20*time.Second, "tasks complete", func() bool { return h.count(protocol.ResultSucceeded) >= 30 })
	victim := "c"
	if first.Leader == "p.c" {
		victim = "b"
	}
	h.proc(victim).Kill()
	killed := time.Now()
	var rerouted time.Duration
	natstest.Eventually(t, 20*time.Second, "routing leaves the dead member", func() bool {
		d, err := cluster.RouteIn(h.state(), "")
		if err != nil || slices.Contains(d.Members, "p."+victim) {
			return false
		}
		rerouted = time.Since(killed)
		return true
	})
	at, who, _ := h.firstSuccessAfter(killed.Add(rerouted), "p."+victim)
	natstest.Eventually(t, 20*time.Second, "work continues", func() bool {
		var ok bool
		at, who, ok = h.firstSuccessAfter(killed.Add(rerouted), "p."+victim)
		return ok
	})
	t.Logf("active_active: member p.%s killed (-9); routed around %s later; next task completed on %s %s after the kill; %s",
		victim, rerouted.Round(time.Millisecond), who, at.Sub(killed).Round(time.Millisecond), roles(h.state()))
	h.start(victim)
	natstest.Eventually(t, 30*time.Second, "it rejoins as a member", func() bool { return roleOf(h.state(), victim) == protocol.RoleMember })
	cancel()
	t.Logf("after restart: %s", roles(h.state()))
}

func TestStateSyncAfterSIGSTOP(t *testing.T) {
	t.Parallel()
	d := definition("sync", protocol.ModeActivePassive, "h1")
	d.Config = map[string]string{"image": "v1"}
	h := newHarness(t, d)
	for _, id := range []string{"a", "b", "c"} {
		h.start(id)
	}
	first := waitLeader(t, h, 2)
	var member string
	for _, m := range first.Members {
		if m.Role == protocol.RoleStandby {
			member = strings.TrimPrefix(m.Key, "p.")
			break
		}
	}
	natstest.Eventually(t, 20*time.Second, "all in sync", func() bool {
		r, ok := h.report(member)
		return ok && r.Digest == h.state().SyncDigest
	})
	p := h.proc(member)
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Change the leader's state while the member is stopped.
	cur, _, _ := h.store.Get(context.Background(), "sync")
	cur.Config["image"] = "v2"
	if _, err := h.store.Update(context.Background(), cur); err != nil {
		t.Fatal(err)
	}
	var want string
	natstest.Eventually(t, 20*time.Second, "the leader publishes the new state", func() bool {
		want = h.state().SyncDigest
		return want != first.SyncDigest
	})
	time.Sleep(4 * time.Second) // stopped past the failure threshold
	if err := p.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	natstest.Eventually(t, 20*time.Second, "the member's digest matches the leader's", func() bool {
		r, ok := h.report(member)
		return ok && r.Digest == want && r.HeartbeatAt.After(resumed.Add(-time.Second))
	})
	took := time.Since(resumed)
	t.Logf("state sync: p.%s resumed; digest %s matches the leader's %s later (sync interval %s)",
		member, want, took.Round(time.Millisecond), cluster.DefaultSyncInterval)
}

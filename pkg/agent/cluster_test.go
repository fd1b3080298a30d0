package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
)

// publishCluster sends a task dispatched through a cluster: the usual
// headers plus the cluster, its epoch and the target.
func (b *bundle) publishCluster(t *testing.T, job string, clusterName string, epoch uint64, target string) {
	t.Helper()
	task := protocol.Task{JobID: job, StepID: "s", Epoch: 1, Attempt: 1, Action: "echo", Params: json.RawMessage(`{"message":"hi"}`),
		Deadline: time.Now().Add(20 * time.Second), Token: protocol.NewLeaseToken()}
	data, _ := json.Marshal(task)
	m := nats.NewMsg(b.agent.TaskSubject())
	m.Data = data
	m.Header.Set(protocol.HeaderJob, job)
	m.Header.Set(protocol.HeaderStep, "s")
	m.Header.Set(protocol.HeaderEpoch, "1")
	m.Header.Set(protocol.HeaderAction, "echo")
	m.Header.Set(protocol.HeaderCluster, clusterName)
	m.Header.Set(protocol.HeaderClusterEpoch, strconv.FormatUint(epoch, 10))
	m.Header.Set(protocol.HeaderTarget, target)
	if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

func TestClusterSDK(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := func(id string) agent.Config {
		c := testConfig(id)
		c.Cluster = "ap"
		return c
	}
	first := setup(t, cfg("a"), nil)
	st, err := cluster.Open(ctx, first.js)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Create(ctx, protocol.ClusterDefinition{Name: "ap", Mode: protocol.ModeActivePassive,
		TargetGroup: protocol.TargetGroup{Name: "hosts", Targets: []string{"h1", "h2"}},
		Membership:  protocol.ClusterMembership{FailureThreshold: protocol.Duration(time.Second)},
		Election:    protocol.ClusterElection{LeaseDuration: protocol.Duration(time.Second)},
		StateSync:   protocol.ClusterStateSync{Interval: protocol.Duration(200 * time.Millisecond)}}); err != nil {
		t.Fatal(err)
	}
	nc2, js2 := first.srv.Connect(t)
	second := &bundle{srv: first.srv, nc: nc2, js: js2}
	second.start(t, cfg("b"), nil)

	var leader, standby *bundle
	natstest.Eventually(t, 10*time.Second, "one leader", func() bool {
		la, lb := first.agent.IsClusterLeader(), second.agent.IsClusterLeader()
		switch {
		case la && !lb:
			leader, standby = first, second
		case lb && !la:
			leader, standby = second, first
		default:
			return false
		}
		return true
	})
	lv, _ := leader.agent.Cluster()
	t.Logf("leader %s epoch %d targets %v", lv.Leader, lv.Epoch, leader.agent.Shards())
	if lv.Role != protocol.RoleLeader || strings.Join(leader.agent.Shards(), ",") != "h1,h2" {
		t.Fatalf("leader view %+v", lv)
	}
	if p, _ := leader.presence(t); p.Cluster != "ap" {
		t.Fatalf("presence cluster %q", p.Cluster)
	}

	// The leader runs a task under its epoch; the standby and a stale epoch are refused.
	leader.publishCluster(t, "j1", "ap", lv.Epoch, "h1")
	if r, _ := leader.result(t, "j1", "s"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("leader: %+v", r)
	}
	standby.publishCluster(t, "j2", "ap", lv.Epoch, "h1")
	if r, _ := standby.result(t, "j2", "s"); r.Status != protocol.ResultFailed || r.ErrorClass != protocol.ClassReroute || !strings.Contains(r.Error, "not the leader") {
		t.Fatalf("standby: %+v", r)
	}
	leader.publishCluster(t, "j3", "ap", lv.Epoch-1, "h1")
	if r, _ := leader.result(t, "j3", "s"); r.Status != protocol.ResultFailed || !strings.Contains(r.Error, "epoch") {
		t.Fatalf("stale epoch: %+v", r)
	}
	t.Logf("fenced: leader %d, standby %d", leader.agent.ClusterFenced(), standby.agent.ClusterFenced())

	// State sync: the leader's entry reaches the standby.
	if err := leader.agent.SetClusterState(agent.ClusterCachedDigests, "image", "sha256:1"); err != nil {
		t.Fatal(err)
	}
	if err := standby.agent.SetClusterState(agent.ClusterCachedDigests, "image", "x"); err == nil {
		t.Fatal("standby wrote the sync state")
	}
	natstest.Eventually(t, 5*time.Second, "standby has the leader's state", func() bool {
		s, _ := standby.agent.ClusterState()
		v, _ := standby.agent.Cluster()
		return s.CachedDigests["image"] == "sha256:1" && v.InSync
	})

	// The standby watches; the leader stops; the standby is told it leads.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := standby.agent.WatchCluster(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := leader.stop(t); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case v := <-ch:
			if v.IsLeader {
				t.Logf("standby now leads: epoch %d", v.Epoch)
				if v.Epoch <= lv.Epoch {
					t.Fatalf("epoch %d not above %d", v.Epoch, lv.Epoch)
				}
				return
			}
		case <-deadline:
			t.Fatal("standby never told it leads")
		}
	}
}

// A leader that is drained steps down at once, and still reports the task
// it was running under the epoch it gave up (a deposed leader would not).
func TestDrainedLeaderReportsItsTask(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := func(id string) agent.Config {
		c := testConfig(id)
		c.Cluster = "dr"
		return c
	}
	started := make(chan struct{}, 2)
	var finished atomic.Bool // set once the drained leader's handler returns
	register := func(a *agent.Agent) {
		a.Handle("slow", func(ctx context.Context, _ *agent.Task) (any, error) {
			started <- struct{}{}
			time.Sleep(3 * time.Second) // margin for the standby to lead meanwhile
			finished.Store(true)
			return "done", nil
		})
	}
	first := setup(t, cfg("a"), register)
	st, err := cluster.Open(ctx, first.js)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Create(ctx, protocol.ClusterDefinition{Name: "dr", Mode: protocol.ModeActivePassive,
		Election: protocol.ClusterElection{LeaseDuration: protocol.Duration(time.Second)}}); err != nil {
		t.Fatal(err)
	}
	nc2, js2 := first.srv.Connect(t)
	second := &bundle{srv: first.srv, nc: nc2, js: js2}
	second.start(t, cfg("b"), register)
	var leader, standby *bundle
	natstest.Eventually(t, 10*time.Second, "one leader", func() bool {
		switch {
		case first.agent.IsClusterLeader() && !second.agent.IsClusterLeader():
			leader, standby = first, second
		case second.agent.IsClusterLeader() && !first.agent.IsClusterLeader():
			leader, standby = second, first
		default:
			return false
		}
		return true
	})
	lv, _ := leader.agent.Cluster()
	task := protocol.Task{JobID: "jd", StepID: "s", Epoch: 1, Attempt: 1, Action: "slow", Deadline: time.Now().Add(20 * time.Second), Token: protocol.NewLeaseToken()}
	data, _ := json.Marshal(task)
	m := nats.NewMsg(leader.agent.TaskSubject())
	m.Data = data
	m.Header.Set(protocol.HeaderCluster, "dr")
	m.Header.Set(protocol.HeaderClusterEpoch, strconv.FormatUint(lv.Epoch, 10))
	if _, err := leader.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- stopWithin(leader, 45*time.Second) }()
	natstest.Eventually(t, 10*time.Second, "the standby leads while the old leader drains", standby.agent.IsClusterLeader)
	// Only a leader that stepped down as it began draining lets the standby
	// lead this soon; without that, the lease is given up when Run returns,
	// after the handler has finished.
	if finished.Load() {
		t.Fatal("the standby led only after the drained leader's handler finished: the drain did not step down")
	}
	if r, _ := standby.result(t, "jd", "s"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("drained leader's result: %+v", r)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// stopWithin cancels b's Run and returns its error, or an error if it has
// not returned within d. Unlike bundle.stop it never calls t.Fatal, so it
// may run off the test goroutine.
func stopWithin(b *bundle, d time.Duration) error {
	b.cancel()
	select {
	case err := <-b.done:
		b.done <- err // let the cleanup see it too
		return err
	case <-time.After(d):
		return fmt.Errorf("agent did not stop within %s", d)
	}
}

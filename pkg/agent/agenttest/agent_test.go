package agenttest_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// kit is a server with Warden's streams; tasks are published by hand, as
// a scheduler would, and results read back from the results stream.
type kit struct {
	nc *nats.Conn
	js jetstream.JetStream
}

func newKit(t *testing.T) *kit {
	t.Helper()
	_, nc, js := natstest.Start(t, streams.Options{})
	return &kit{nc: nc, js: js}
}

func (k *kit) sendTask(t *testing.T, a *agenttest.Agent, job string) {
	t.Helper()
	task := protocol.Task{JobID: job, StepID: "s", Epoch: 1, Attempt: 1, Action: "echo", Token: "tok",
		Params: json.RawMessage(`{"n":1}`), Deadline: time.Now().Add(time.Minute)}
	b, _ := json.Marshal(task)
	m := nats.NewMsg(a.Runtime().TaskSubject())
	m.Data = b
	m.Header.Set(protocol.HeaderMsgID, protocol.TaskMsgID(job, "s", 1))
	if _, err := k.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

func (k *kit) result(t *testing.T, a *agenttest.Agent, job string) (protocol.Result, bool) {
	t.Helper()
	s, err := k.js.Stream(context.Background(), protocol.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	cfg := a.Runtime().Config()
	// The stream stores results under the job's partition.
	for p := range streams.DefaultPartitions {
		subj := protocol.SubjectResultPrefix + "." + itoa(p) + "." + cfg.Pool + "." + cfg.ID + "." + job + ".s"
		m, err := s.GetLastMsgForSubject(context.Background(), subj)
		if err == nil {
			var r protocol.Result
			if err := json.Unmarshal(m.Data, &r); err != nil {
				t.Fatal(err)
			}
			return r, true
		}
	}
	return protocol.Result{}, false
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestScriptedAgentRepliesAsScripted(t *testing.T) {
	t.Parallel()
	k := newKit(t)
	a := agenttest.StartAgent(t, k.nc, agent.Config{ID: "a1", Pool: "p", Capabilities: []string{"gpu"}})

	k.sendTask(t, a, "j1") // default: succeed, echoing the params
	natstest.Eventually(t, 10*time.Second, "echo result", func() bool {
		r, ok := k.result(t, a, "j1")
		return ok && r.Status == protocol.ResultSucceeded && string(r.Output) == `{"n":1}` && r.Token == "tok"
	})

	a.Script(func(context.Context, *agent.Task) (any, error) {
		return nil, agent.Permanent(errors.New("disk full"))
	})
	k.sendTask(t, a, "j2")
	natstest.Eventually(t, 10*time.Second, "failed result", func() bool {
		r, ok := k.result(t, a, "j2")
		return ok && r.Status == protocol.ResultFailed && r.Error == "disk full" && r.ErrorClass == protocol.ClassPermanent
	})
	if got := a.Received(); len(got) != 2 || got[0].JobID != "j1" || got[1].JobID != "j2" {
		t.Fatalf("received %+v", got)
	}
}

func TestScriptedAgentDropsAndReportsCounters(t *testing.T) {
	t.Parallel()
	k := newKit(t)
	a := agenttest.StartAgent(t, k.nc, agent.Config{ID: "a1", Pool: "p", MaxDeliver: 2, Lease: protocol.Duration(time.Second)})
	a.Script(func(context.Context, *agent.Task) (any, error) { return nil, agenttest.ErrDrop })
	k.sendTask(t, a, "j1")
	// Dropped (handed back) on both deliveries, never reported.
	natstest.Eventually(t, 10*time.Second, "two deliveries", func() bool { return len(a.Received()) == 2 })
	if _, ok := k.result(t, a, "j1"); ok {
		t.Fatal("a dropped task was reported")
	}
	a.Report(7, 3)
	kv, err := k.js.KeyValue(context.Background(), protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "counters in presence", func() bool {
		e, err := kv.Get(context.Background(), protocol.PresenceKey("p", "a1"))
		if err != nil {
			return false
		}
		var p protocol.Presence
		return json.Unmarshal(e.Value(), &p) == nil && p.Succeeded == 7 && p.Failed == 3
	})
}

func TestScriptedAgentObeysAndRecordsOrders(t *testing.T) {
	t.Parallel()
	k := newKit(t)
	a := agenttest.StartAgent(t, k.nc, agent.Config{ID: "a1", Pool: "p"})
	body, _ := json.Marshal(protocol.Control{Op: protocol.ControlDrain})
	reply, err := k.nc.Request(protocol.AgentControlSubject("p", "a1"), body, 5*time.Second)
	if err != nil {
		t.Fatalf("drain: %v", err)
	}
	if _, err := protocol.ParseReply(reply.Data); err != nil {
		t.Fatalf("drain: %v", err)
	}
	natstest.Eventually(t, 5*time.Second, "order recorded", func() bool {
		o := a.Orders()
		return len(o) == 1 && o[0] == protocol.ControlDrain
	})
}

func TestCrashedAgentHoldsItsTaskUnreported(t *testing.T) {
	t.Parallel()
	k := newKit(t)
	a := agenttest.StartAgent(t, k.nc, agent.Config{ID: "a1", Pool: "p"})
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	a.Script(func(context.Context, *agent.Task) (any, error) { <-hold; return nil, nil })
	k.sendTask(t, a, "j1")
	natstest.Eventually(t, 10*time.Second, "task held", func() bool { return len(a.Received()) == 1 })
	a.Leave()
	if _, ok := k.result(t, a, "j1"); ok {
		t.Fatal("a crashed agent reported")
	}
	kv, _ := k.js.KeyValue(context.Background(), protocol.BucketPresence)
	if _, err := kv.Get(context.Background(), protocol.PresenceKey("p", "a1")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("presence after Leave: %v", err)
	}
	// The task is still in the stream, unacknowledged, for another agent.
	s, _ := k.js.Stream(context.Background(), protocol.TaskStream(protocol.Shard("p", "a1", streams.DefaultTaskShards)))
	info, _ := s.Info(context.Background())
	if info.State.Msgs != 1 {
		t.Fatalf("%d tasks left in the stream, want 1", info.State.Msgs)
	}
}

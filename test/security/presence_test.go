package security

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/creds"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
)

// A consumer's deliver subject is not within reach of NATS permissions
// (the create subject carries its name and filter only), and the server
// delivers with the stream's own rights. An agent that could create a
// consumer on its presence key could write anything, headers included, to
// its key and have it delivered to any subject: a drain order to every
// agent, a roll-up purging a stream. The agent's credential has no
// consumer on KV_warden_presence at all.
func TestAgentCannotConsumeItsPresenceKey(t *testing.T) {
	d := start(t, pool+".a1", pool+".a2")
	d.setupStreams(t)
	a1 := d.connect(t, creds.AgentIdentity(pool, "a1"))
	a2 := d.connect(t, creds.AgentIdentity(pool, "a2"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	orders, err := a2.nc.SubscribeSync(protocol.AgentControlSubject(pool, "a2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a2.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// What a1 may write: its own key, any value.
	kv, err := a1.js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	key := "$KV." + protocol.BucketPresence + "." + protocol.PresenceKey(pool, "a1")
	if _, err := kv.Put(ctx, protocol.PresenceKey(pool, "a1"), []byte(`{"op":"drain"}`)); err != nil {
		t.Fatalf("a1 writes its presence key: %v", err)
	}

	stream := "KV_" + protocol.BucketPresence
	req, _ := json.Marshal(map[string]any{
		"stream_name": stream,
		"config": nats.ConsumerConfig{
			Name: "forge", DeliverSubject: protocol.AgentControlSubject(pool, "a2"), FilterSubject: key,
			DeliverPolicy: nats.DeliverLastPerSubjectPolicy, AckPolicy: nats.AckNonePolicy, MemoryStorage: true,
		},
	})
	for _, subj := range []string{
		// Filtered on its own key: what the agent's watch used.
		"$JS.API.CONSUMER.CREATE." + stream + ".forge." + key,
		"$JS.API.CONSUMER.CREATE." + stream + ".forge",
		"$JS.API.CONSUMER.CREATE." + stream,
		"$JS.API.CONSUMER.DURABLE.CREATE." + stream + ".forge",
	} {
		if m, err := a1.nc.Request(subj, req, 500*time.Millisecond); err == nil {
			t.Errorf("a1 created a consumer on %s with %s: %s", stream, subj, m.Data)
			continue
		}
		a1.expectRefused(t, "publish", subj)
	}
	// Nor may it delete one (another process's watcher).
	del := "$JS.API.CONSUMER.DELETE." + stream + ".forge"
	if m, err := a1.nc.Request(del, nil, 500*time.Millisecond); err == nil {
		t.Errorf("a1 deleted a consumer of %s: %s", stream, m.Data)
	} else {
		a1.expectRefused(t, "publish", del)
	}

	// Nothing reached a2's control subject (the deliveries would have
	// followed the create at once).
	if err := a1.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := orders.NextMsg(time.Second); err == nil {
		t.Fatalf("a2 received %q (reply %q, headers %v) on its control subject", m.Data, m.Reply, m.Header)
	} else if !errors.Is(err, nats.ErrTimeout) {
		t.Fatal(err)
	}
}

// inProcessAgentConfig is agent <pool>.<id> of the test deployment.
func inProcessAgentConfig(id string) agent.Config {
	return agent.Config{ID: id, Pool: pool, TaskShards: shards,
		HeartbeatInterval: protocol.Duration(200 * time.Millisecond), FetchWait: protocol.Duration(time.Second)}
}

// runAgentInProcess runs agent id in-process with its own credential
// until the test ends; it returns Run's result channel once the agent is
// ready.
func (d *deployment) runAgentInProcess(t *testing.T, id string) (*agent.Agent, <-chan error) {
	t.Helper()
	c := d.connect(t, creds.AgentIdentity(pool, id))
	a, err := agent.New(inProcessAgentConfig(id), agent.WithConn(c.nc), agent.WithLogger(zerolog.New(zerolog.NewTestWriter(t))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(45 * time.Second):
			t.Error("agent did not stop")
		}
	})
	select {
	case <-a.Ready():
	case err := <-done:
		t.Fatalf("agent %s stopped before ready: %v", id, err)
	case <-time.After(15 * time.Second):
		t.Fatalf("agent %s not ready", id)
	}
	return a, done
}

// The duplicate check (internal/presence) works with the agent's own
// credential, which creates no consumer on the presence bucket: a second
// agent with the same id, started while the first runs, is refused, and
// the server refused nothing either of them did.
func TestDuplicateAgentRefusedWithItsCredential(t *testing.T) {
	r, err := creds.Agent(pool, "a1", shards)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range r.Pub {
		if strings.HasPrefix(p, "$JS.API.CONSUMER.") && strings.Contains(p, "KV_"+protocol.BucketPresence) ||
			strings.HasPrefix(p, "$JS.FC.KV_"+protocol.BucketPresence) {
			t.Errorf("the agent's credential allows %s", p)
		}
	}

	d := start(t, pool+".a1")
	d.setupStreams(t)
	_, firstDone := d.runAgentInProcess(t, "a1")

	second := d.connect(t, creds.AgentIdentity(pool, "a1"))
	a, err := agent.New(inProcessAgentConfig("a1"), agent.WithConn(second.nc), agent.WithLogger(zerolog.New(zerolog.NewTestWriter(t))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = a.Run(ctx)
	var dup *presence.DuplicateError
	if !errors.As(err, &dup) || dup.TakenOver {
		t.Fatalf("second agent a1: %v, want a *presence.DuplicateError", err)
	}
	select {
	case err := <-firstDone:
		t.Fatalf("the first agent stopped: %v", err)
	default:
	}
	if got := second.refusals(); len(got) != 0 {
		t.Fatalf("the second agent was refused: %v", got)
	}
	d.log.none(t, "two agents a1")
}

// A key a crashed run left behind is taken over once it expires, reading
// it with the agent's own credential (no watch).
func TestCrashedAgentsKeyRetakenWithItsCredential(t *testing.T) {
	d := start(t, pool+".a1")
	d.setupStreams(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	announcer := func(pid int) (*presence.Announcer, *conn) {
		c := d.connect(t, creds.AgentIdentity(pool, "a1"))
		kv, err := c.js.KeyValue(ctx, protocol.BucketPresence)
		if err != nil {
			t.Fatal(err)
		}
		started := time.Now().UTC()
		a, err := presence.NewAnnouncer(kv, presence.AnnouncerConfig{Pool: pool, ID: "a1", Interval: 200 * time.Millisecond,
			Presence: func() protocol.Presence {
				return protocol.Presence{ID: "a1", Pool: pool, Host: "h", PID: pid, StartedAt: started}
			}})
		if err != nil {
			t.Fatal(err)
		}
		return a, c
	}
	crashed, _ := announcer(1)
	crashCtx, crash := context.WithCancel(ctx)
	if err := crashed.Start(crashCtx); err != nil {
		t.Fatalf("start: %v", err)
	}
	crash() // heartbeats stop, the key stays
	<-crashed.Done()

	restarted, c := announcer(2)
	st, err := c.js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	// The crash left the key: only its expiry can let the restart in.
	// (Start bounds the wait itself, giving up with ErrStaleKey after the
	// TTL + 1 s; the test does not time it.)
	old, err := st.Get(ctx, protocol.PresenceKey(pool, "a1"))
	var op protocol.Presence
	if err != nil || json.Unmarshal(old.Value(), &op) != nil || op.PID != 1 {
		t.Fatalf("key after the crash: %+v, %v; want the crashed run's", op, err)
	}
	if err := restarted.Start(ctx); err != nil {
		t.Fatalf("restart after a crash: %v", err)
	}
	defer func() { _ = restarted.Stop(ctx) }()
	e, err := st.Get(ctx, protocol.PresenceKey(pool, "a1"))
	var p protocol.Presence
	if err != nil || json.Unmarshal(e.Value(), &p) != nil || p.PID != 2 || e.Revision() <= old.Revision() {
		t.Fatalf("key after the restart: %+v, %v", p, err)
	}
	if got := c.refusals(); len(got) != 0 {
		t.Fatalf("refused: %v", got)
	}
	d.log.none(t, "a restart after a crash")
}

// An agent answers a control request only on an inbox: the reply subject
// is the requester's choice and the answer goes out with the agent's own
// permissions (allow responses). A request to a1 replying to
// $KV.warden_presence.<pool>.a2 had a1's answer overwrite a2's presence.
func TestControlAnswerOnlyOnAnInbox(t *testing.T) {
	d := start(t, pool+".a1", pool+".a2")
	d.setupStreams(t)
	d.runAgentInProcess(t, "a1")
	a2 := d.connect(t, creds.AgentIdentity(pool, "a2"))
	admin := d.connect(t, creds.RoleAdmin)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	kv, err := a2.js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(ctx, protocol.PresenceKey(pool, "a2"), []byte(`{"id":"a2","pool":"default"}`))
	if err != nil {
		t.Fatalf("a2 writes its presence: %v", err)
	}
	for _, reply := range []string{
		"$KV." + protocol.BucketPresence + "." + protocol.PresenceKey(pool, "a2"),
		// Its own key: the answer would have replaced its presence, and
		// its next heartbeat taken that for a duplicate and stopped it.
		"$KV." + protocol.BucketPresence + "." + protocol.PresenceKey(pool, "a1"),
	} {
		m := &nats.Msg{Subject: protocol.AgentControlSubject(pool, "a1"), Reply: reply, Data: []byte(`{"op":"undrain"}`)}
		if err := admin.nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	// An order on an inbox is answered, after the forged ones.
	m, err := admin.nc.Request(protocol.AgentControlSubject(pool, "a1"), []byte(`{"op":"undrain"}`), 5*time.Second)
	if err != nil {
		t.Fatalf("undrain on an inbox: %v", err)
	}
	if r := string(m.Data); !strings.Contains(r, `"ok":true`) {
		t.Fatalf("undrain on an inbox: %s", r)
	}
	// The agent answered (or not) the forged requests before this one;
	// give the stream a second to store an answer.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		e, err := kv.Get(ctx, protocol.PresenceKey(pool, "a2"))
		if err != nil || e.Revision() != rev {
			var v []byte
			if err == nil {
				v = e.Value()
			}
			t.Fatalf("a2's presence changed: %q, %v (was revision %d)", v, err, rev)
		}
	}
	d.log.none(t, "control requests")
}

// An agent outside a cluster has no access to the clusters bucket: a
// consumer there could deliver cluster records to any subject (its
// deliver_subject is out of reach of permissions), and it reads none.
func TestAgentOutsideAClusterCannotConsumeClusters(t *testing.T) {
	d := start(t, pool+".a1")
	d.setupStreams(t)
	a1 := d.connect(t, creds.AgentIdentity(pool, "a1"))
	stream := "KV_" + protocol.BucketClusters
	req, _ := json.Marshal(map[string]any{
		"stream_name": stream,
		"config": nats.ConsumerConfig{Name: "forge", DeliverSubject: protocol.AgentControlSubject(pool, "a2"),
			DeliverPolicy: nats.DeliverAllPolicy, AckPolicy: nats.AckNonePolicy, MemoryStorage: true},
	})
	for _, subj := range []string{
		"$JS.API.CONSUMER.CREATE." + stream + ".forge",
		"$JS.API.CONSUMER.CREATE." + stream + ".forge.$KV." + protocol.BucketClusters + ".>",
		"$JS.API.DIRECT.GET." + stream + ".$KV." + protocol.BucketClusters + ".c",
	} {
		if m, err := a1.nc.Request(subj, req, 500*time.Millisecond); err == nil {
			t.Errorf("a1 (in no cluster) was answered on %s: %s", subj, m.Data)
			continue
		}
		a1.expectRefused(t, "publish", subj)
	}
}

package supervisor_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
	"github.com/wardenhq/warden/test/handagent"
)

// holding starts agent id, which takes the task of a submitted one-step
// job and holds it (alive, its lease kept) until the test ends; it returns
// the task message's stream and sequence.
func (b *bundle) holding(t *testing.T, id, job string) (jetstream.Stream, uint64) {
	t.Helper()
	a := handagent.Start(t, b.js, "default", id, []string{id})
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	a.Reply(func(protocol.Task) protocol.Result { <-hold; return protocol.Result{Status: handagent.Drop} })
	b.submit(t, job, "name: h\nsteps: [{id: s, action: echo, requires: ["+id+"]}]")
	natstest.Eventually(t, 15*time.Second, id+" holds its task", func() bool { return len(a.Received()) == 1 })
	shard := protocol.Shard("default", id, streams.DefaultTaskShards)
	s, err := b.js.Stream(context.Background(), protocol.TaskStream(shard))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetLastMsgForSubject(context.Background(), protocol.TaskSubject(shard, "default", id))
	if err != nil {
		t.Fatal(err)
	}
	return s, raw.Sequence
}

func (b *bundle) forgeAdvisory(t *testing.T, subjectStream, stream, consumer string, seq, deliveries uint64) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"type": "io.nats.jetstream.advisory.v1.max_deliver", "id": "forged", "stream": stream, "consumer": consumer,
		"stream_seq": seq, "deliveries": deliveries,
	})
	if err := b.nc.Publish("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."+subjectStream+"."+consumer, body); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) msgs(t *testing.T, stream string) (first, n uint64) {
	t.Helper()
	s, err := b.js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.FirstSeq, info.State.Msgs
}

// Issue 9: a forged MAX_DELIVERIES advisory dead-lettered a healthy step.
// The leader now checks the advisory against the message and its consumer
// first: forged ones change nothing and each raises advisory_rejected.
func TestForgedAdvisoryChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, scheduler.Config{}, supervisor.Config{})
	stream, seq := b.holding(t, "busy", "job-healthy")
	name := stream.CachedInfo().Config.Name
	b.forgeAdvisory(t, name, name, "busy", seq, 5)                // a healthy task in flight
	b.forgeAdvisory(t, name, protocol.StreamEvents, "busy", 1, 5) // names the events stream
	b.forgeAdvisory(t, name, name, "other", seq, 5)               // names another agent's consumer
	b.forgeAdvisory(t, name, name, "busy", seq+1000, 5)           // a message that does not exist
	var rejected []protocol.Event
	natstest.Eventually(t, 15*time.Second, "three advisories rejected", func() bool {
		rejected = b.events(t, protocol.EventAdvisoryRejected)
		return len(rejected) == 3
	})
	for _, e := range rejected {
		t.Logf("rejected: %s", e.Reason)
	}
	st := b.step(t, "job-healthy", "s")
	if st.State != jobstore.StepDispatched || st.Actor != "busy" || st.Epoch != 1 {
		t.Fatalf("step %s on %s at epoch %d after forged advisories", st.State, st.Actor, st.Epoch)
	}
	if _, n := b.msgs(t, protocol.StreamDLQ); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
	if _, err := stream.GetMsg(context.Background(), seq); err != nil {
		t.Fatalf("the task was taken from the agent's queue: %v", err)
	}
	if n := len(b.events(t, protocol.EventDeadLettered)); n != 0 {
		t.Fatalf("%d dead_lettered events", n)
	}
}

// Issue 9: a forged presence record naming another stream as its task
// stream made failover delete every event, result and dead letter. The
// supervisor derives an agent's queue from its pool and id alone: failing
// over an agent whose presence names the dead letters, the events, or
// another agent's queue touches none of them.
func TestForgedPresenceCannotPointFailoverElsewhere(t *testing.T) {
	t.Parallel()
	b := setup(t, scheduler.Config{}, supervisor.Config{FailureThreshold: protocol.Duration(300 * time.Millisecond)})
	ctx := context.Background()
	victimStream, victimSeq := b.holding(t, "victim", "job-victim")
	letter := nats.NewMsg(protocol.DLQSubject("default", "someone"))
	letter.Data = []byte(`{}`)
	if _, err := b.js.PublishMsg(ctx, letter); err != nil {
		t.Fatal(err)
	}
	if err := b.nc.Publish(protocol.EventSubject("note", "x"), []byte(`{"kind":"note","id":"x"}`)); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "an event stored", func() bool { _, n := b.msgs(t, protocol.StreamEvents); return n > 0 })
	evFirst, _ := b.msgs(t, protocol.StreamEvents)
	shard := protocol.Shard("default", "victim", streams.DefaultTaskShards)
	kv, err := b.js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	for _, forged := range []protocol.Presence{
		{ID: "evil1", Pool: "default", TaskStream: protocol.StreamDLQ, TaskSubject: protocol.SubjectDLQPrefix + ".>"},
		{ID: "evil2", Pool: "default", TaskStream: protocol.StreamEvents, TaskSubject: protocol.SubjectEventPrefix + ".>"},
		{ID: "evil3", Pool: "default", TaskStream: protocol.TaskStream(shard), TaskSubject: protocol.TaskSubject(shard, "default", "victim")},
	} {
		forged.HeartbeatAt, forged.StartedAt, forged.MaxConcurrent = time.Now(), time.Now(), 1
		v, _ := json.Marshal(forged)
		if _, err := kv.Put(ctx, protocol.PresenceKey("default", forged.ID), v); err != nil {
			t.Fatal(err)
		}
	}
	// The presence view refuses such records (presence.View validates
	// them), so they never reach the failover loop; an operator's failover
	// request still names them. Failing them over must touch only the
	// queues their pool and id derive.
	for _, id := range []string{"evil1", "evil2", "evil3"} {
		var reply []byte
		natstest.Eventually(t, 15*time.Second, "failover of "+id+" answered", func() bool {
			m, err := b.nc.Request(protocol.SubjectControlFailover, []byte("default."+id), 5*time.Second)
			if err != nil {
				return false
			}
			reply = m.Data
			return true
		})
		detail, err := protocol.ParseReply(reply)
		if err != nil || !strings.Contains(detail, supervisor.OutcomeNothing) {
			t.Fatalf("failover of %s: %q %v", id, detail, err)
		}
		t.Logf("failover of %s: %s", id, detail)
	}
	if _, n := b.msgs(t, protocol.StreamDLQ); n != 1 {
		t.Fatalf("%d dead letters, want the 1 stored", n)
	}
	if first, _ := b.msgs(t, protocol.StreamEvents); first != evFirst {
		t.Fatalf("events deleted: first sequence %d, was %d", first, evFirst)
	}
	if _, err := victimStream.GetMsg(ctx, victimSeq); err != nil {
		t.Fatalf("the victim's task was taken: %v", err)
	}
	if st := b.step(t, "job-victim", "s"); st.State != jobstore.StepDispatched || st.Actor != "victim" || st.Epoch != 1 {
		t.Fatalf("victim's step %s on %s at epoch %d", st.State, st.Actor, st.Epoch)
	}
}

// A failover order without an inbox to answer is not an operator's: a
// consumer's delivery (reply $JS.ACK.…) can carry what an agent wrote to a
// key it may write to this subject (nats-io/nats-server#8274), and the
// answer, let through by the response permission, went wherever the reply
// pointed. Such orders are dropped; the live agent keeps its step.
func TestFailoverOrderWithoutAnInboxIsDropped(t *testing.T) {
	t.Parallel()
	b := setup(t, scheduler.Config{}, supervisor.Config{FailureThreshold: protocol.Duration(300 * time.Millisecond)})
	b.holding(t, "victim", "job-victim")
	if err := b.nc.Publish(protocol.SubjectControlFailover, []byte("default.victim")); err != nil {
		t.Fatal(err)
	}
	if err := b.nc.PublishRequest(protocol.SubjectControlFailover, "$JS.ACK.KV_warden_presence.forge.1.1.1.1.0", []byte("default.victim")); err != nil {
		t.Fatal(err)
	}
	// An operator's order for an agent nobody knows, answered once the
	// forged ones before it were handled.
	natstest.Eventually(t, 15*time.Second, "a failover request answered", func() bool {
		_, err := b.nc.Request(protocol.SubjectControlFailover, []byte("default.nobody"), 5*time.Second)
		return err == nil
	})
	if st := b.step(t, "job-victim", "s"); st.State != jobstore.StepDispatched || st.Actor != "victim" || st.Epoch != 1 {
		t.Fatalf("victim's step %s on %s at epoch %d after forged failover orders", st.State, st.Actor, st.Epoch)
	}
}

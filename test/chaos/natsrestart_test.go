package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Restarting nats-server (same store, same port) under a steady load of
// jobs on 20 agents loses no job, fails over no live agent, finds a target
// for every step, and no step waits longer than its lease: "I could not
// see" is never taken for "the agent is gone".
func TestNATSRestartsUnderLoadFailOverNobody(t *testing.T) {
	if !*fullFlag {
		t.Skip("about 90 s of real processes and three server restarts: make chaos runs it (-chaos.full)")
	}
	sc := newScenario(t)
	c, js := sc.c, sc.js
	for i := range 2 {
		sc.supervisor(fmt.Sprintf("sup-%d", i))
	}
	const agents = 20
	for i := range agents {
		id := fmt.Sprintf("ra-%02d", i)
		sc.agent(id)
	}
	waitFor(t, 30*time.Second, "20 agents present", func() bool { return presentAgents(js) == agents })

	// A steady load: a job every 50 ms, each one step of 200 ms.
	var ids []string
	submit := func(i int) {
		id := fmt.Sprintf("rs-%04d", i)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := js.Publish(ctx, protocol.SubmitSubject(id),
				[]byte(`{"name":"restart","steps":[{"id":"s","action":"ledger","params":{"duration":"200ms"}}]}`))
			cancel()
			if err == nil {
				ids = append(ids, id)
				return
			}
			time.Sleep(100 * time.Millisecond) // the server is restarting: the job is not accepted yet
		}
	}
	start := time.Now()
	restarts, i := 0, 0
	for time.Since(start) < 32*time.Second {
		if restarts < 3 && time.Since(start) > time.Duration(restarts+1)*8*time.Second {
			c.restartNATS()
			restarts++
			t.Logf("nats-server restart %d at %s", restarts, time.Since(start).Round(time.Millisecond))
		}
		submit(i)
		i++
		time.Sleep(50 * time.Millisecond)
	}
	store, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	var longest time.Duration
	var slowest string
	for _, id := range ids {
		var j *jobstore.Job
		deadline := time.Now().Add(60 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			got, _, err := store.Job(ctx, id)
			cancel()
			j = got
			if err == nil && got.State == jobstore.JobSucceeded {
				break
			}
			if time.Now().After(deadline) {
				b, _ := json.Marshal(got)
				t.Fatalf("job %s did not succeed within 60 s: %v\n%s\n%s", id, err, b, consumerOf(js, got))
			}
			time.Sleep(50 * time.Millisecond)
		}
		st := j.Steps[0]
		if wait := st.Attempts[0].StartedAt.Sub(j.CreatedAt); wait > longest {
			longest, slowest = wait, id
		}
	}
	failed := len(eventsOf(t, js, protocol.EventAgentFailed))
	var failovers, noTarget int
	for _, e := range eventsOf(t, js, protocol.EventFailover) {
		failovers++
		if e.Data["outcome"] == "no_target" {
			noTarget++
		}
	}
	t.Logf("%d jobs through %d nats-server restarts: 0 lost; %d agent_failed events, %d failovers (%d no_target); longest wait for a dispatch %s (job %s)",
		len(ids), restarts, failed, failovers, noTarget, longest.Round(time.Millisecond), slowest)
	if failed > 0 || failovers > 0 || noTarget > 0 {
		t.Fatalf("live agents were failed over after server restarts: %d agent_failed, %d failovers, %d no_target", failed, failovers, noTarget)
	}
	// The lease of a step is its timeout (5 m by default) plus 30 s of
	// grace; no step should come close.
	if lease := 5*time.Minute + 30*time.Second; longest >= lease {
		t.Fatalf("a step waited %s for its dispatch, longer than its lease %s", longest, lease)
	}
}

func presentAgents(js jetstream.JetStream) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		return 0
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return 0
	}
	n := 0
	for range keys.Keys() {
		n++
	}
	return n
}

func eventsOf(t *testing.T, js jetstream.JetStream, kind protocol.EventKind) []protocol.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return readEvents(ctx, js, kind)
}

// consumerOf describes the task consumer of the agent holding the job's
// step: where a dispatched step that never ran is stuck.
func consumerOf(js jetstream.JetStream, j *jobstore.Job) string {
	if j == nil || len(j.Steps) == 0 || j.Steps[0].Actor == "" {
		return "no actor"
	}
	st := j.Steps[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	stream := protocol.TaskStream(protocol.Shard(st.Pool, st.Actor, 4))
	c, err := js.Consumer(ctx, stream, st.Actor)
	if err != nil {
		return fmt.Sprintf("consumer %s on %s: %v", st.Actor, stream, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return err.Error()
	}
	b, _ := json.Marshal(info)
	return string(b)
}

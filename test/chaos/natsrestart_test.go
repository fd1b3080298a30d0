package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
	// A short step lease (timeout 10 s + 2 s of grace) that the bound on
	// the wait for a dispatch below can actually be measured against.
	cfg := filepath.Join(t.TempDir(), "scheduler.yaml")
	if err := os.WriteFile(cfg, []byte("dispatch_grace: 2s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const stepTimeout, grace = 10 * time.Second, 2 * time.Second
	sc := newScenario(t, "--config", cfg)
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

	// A steady load: a job every 50 ms, each one step of 200 ms. A publish
	// whose PubAck was lost is retried with the same Nats-Msg-Id, so the
	// server stores the job once.
	var ids []string
	submit := func(i int) {
		id := fmt.Sprintf("rs-%04d", i)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := js.Publish(ctx, protocol.SubmitSubject(id),
				[]byte(`{"name":"restart","steps":[{"id":"s","action":"ledger","timeout":"10s","params":{"duration":"200ms"}}]}`),
				jetstream.WithMsgID(id))
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
			kill := restarts%2 == 1 // every other restart is a SIGKILL
			c.restartNATS(kill)
			restarts++
			t.Logf("nats-server restart %d (SIGKILL: %v) at %s", restarts, kill, time.Since(start).Round(time.Millisecond))
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
	// One execution per job: a job stored twice, or a task delivered again
	// after a restart, shows here.
	perJob := map[string]int{}
	for _, r := range readLedger(t, sc.ledger) {
		perJob[r.job]++
	}
	dup := 0
	for _, id := range ids {
		switch n := perJob[id]; {
		case n == 0:
			t.Errorf("job %s succeeded but the ledger has no execution of it", id)
		case n > 1:
			dup += n - 1
			t.Logf("job %s executed %d times", id, n)
		}
	}
	t.Logf("%d jobs through %d nats-server restarts: 0 lost; %d duplicate executions; %d agent_failed events, %d failovers (%d no_target); longest wait for a dispatch %s (job %s)",
		len(ids), restarts, dup, failed, failovers, noTarget, longest.Round(time.Millisecond), slowest)
	if failed > 0 || failovers > 0 || noTarget > 0 {
		t.Fatalf("live agents were failed over after server restarts: %d agent_failed, %d failovers, %d no_target", failed, failovers, noTarget)
	}
	// The lease of a step is its timeout plus the dispatch grace; no step
	// should wait that long for its dispatch.
	if lease := stepTimeout + grace; longest >= lease {
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
	evs, err := readEvents(ctx, js, kind)
	if err != nil {
		t.Fatalf("read %s events: %v", kind, err)
	}
	return evs
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

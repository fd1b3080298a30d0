package chaos

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/procs"
)

// A supervisor leader frozen past its lease is deposed: the standby takes
// over and fails over an agent that died meanwhile; the old leader, resumed,
// steps down without publishing anything itself, so every agent_failed and
// failover event exists once.
func TestDeposedLeaderDuplicatesNothing(t *testing.T) {
	if !*fullFlag {
		t.Skip("a supervisor frozen past its lease: make chaos runs it (-chaos.full)")
	}
	sc := newScenario(t)
	js, ledger := sc.js, sc.ledger
	sups := map[string]*procs.Proc{}
	for _, id := range []string{"sup-a", "sup-b"} {
		sups[id] = sc.supervisor(id)
	}
	victim := sc.agent("victim")
	sc.agent("survivor")
	waitFor(t, 30*time.Second, "2 agents present", func() bool { return presentAgents(js) == 2 })
	leader := ""
	waitFor(t, 30*time.Second, "a supervisor leads", func() bool { leader = leaseHolder(js); return leader != "" })
	standby := "sup-a"
	if leader == "sup-a" {
		standby = "sup-b"
	}
	// A step the victim holds, so its failover moves something.
	if _, err := js.Publish(context.Background(), protocol.SubmitSubject("job-deposed"),
		[]byte(`{"name":"d","steps":[{"id":"s","action":"ledger","agent":"victim","params":{"duration":"30s"}}]}`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the victim runs the step", func() bool { return ledgerLines(t, ledger, "job-deposed") >= 1 })

	_ = sups[leader].Signal(syscall.SIGSTOP)
	victim.Kill()
	waitFor(t, 30*time.Second, "the standby leads", func() bool { return leaseHolder(js) == standby })
	waitFor(t, 30*time.Second, "the victim is failed over", func() bool {
		return len(eventsOf(t, js, protocol.EventAgentFailed)) >= 1
	})
	_ = sups[leader].Signal(syscall.SIGCONT)
	// The old leader notices at its next renewal that the lease is gone,
	// logs "stepping down", stops its leading goroutine and campaigns
	// again: "standing by" after "stepping down" (one before it is the
	// startup campaign) says the old leader has stopped publishing.
	waitFor(t, 30*time.Second, "the old leader steps down and stands by", func() bool {
		out := sups[leader].Output()
		i := strings.Index(out, "stepping down")
		return i >= 0 && strings.Contains(out[i:], "standing by")
	})
	// Anything the old leader published on its way out is stored by now;
	// give it a few more seconds anyway before counting.
	time.Sleep(3 * time.Second)
	failed := eventsOf(t, js, protocol.EventAgentFailed)
	failovers := eventsOf(t, js, protocol.EventFailover)
	t.Logf("%s frozen, %s took over; after %s resumed: %d agent_failed, %d failover events", leader, standby, leader, len(failed), len(failovers))
	seen := map[string]int{}
	for _, e := range append(failed, failovers...) {
		seen[string(e.Kind)+"/"+e.Agent]++
	}
	for k, n := range seen {
		if n > 1 {
			t.Errorf("event %s stored %d times", k, n)
		}
	}
	if len(failed) != 1 {
		t.Fatalf("%d agent_failed events for one dead agent, want 1", len(failed))
	}
}

// leaseHolder returns the id of the supervisor holding the leader lease.
func leaseHolder(js jetstream.JetStream) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, protocol.BucketLeases)
	if err != nil {
		return ""
	}
	e, err := kv.Get(ctx, "supervisor")
	if err != nil {
		return ""
	}
	for _, id := range []string{"sup-a", "sup-b"} {
		if strings.Contains(string(e.Value()), `"`+id+`"`) {
			return id
		}
	}
	return ""
}

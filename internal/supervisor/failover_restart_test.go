package supervisor_test

import (
	"context"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
	"github.com/wardenhq/warden/test/handagent"
)

// An agent that crashed with a task in hand just before a nats-server
// restart long enough to end the supervisor leader's term: the new term's
// presence view never saw it (no departure), and the orphan scan looked for
// absent agents only among the task consumers, which live in memory: the
// restart had forgotten the crashed agent's. Its task sat in its queue
// until the step's lease ended (the step timeout plus the dispatch grace).
// The scan reads the task streams' subjects now: the agent is failed over
// after the threshold and the step runs elsewhere.
//
// Old code: "s succeeds on a2" not met after 30s (step dispatched to a1,
// waiting for its lease).
func TestAgentLostInAServerRestartIsFailedOver(t *testing.T) {
	t.Parallel()
	r := startRestartable(t)
	nc, js := r.connect(t)
	r.Ensure(t, js, streams.Options{})
	store, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{srv: r.Server, nc: nc, js: js, store: store}
	snc, _ := r.connect(t)
	s, err := scheduler.New(scheduler.Config{}, snc, scheduler.WithLogger(testLogger(t, "scheduler")))
	if err != nil {
		t.Fatal(err)
	}
	run(t, "scheduler", s.Run)
	vnc, _ := r.connect(t)
	v, err := supervisor.New(supervisor.Config{LeaseTTL: protocol.Duration(2 * time.Second)}, vnc, testLogger(t, "supervisor"), nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, "supervisor", v.Run)
	<-v.Leading()

	a1 := handagent.Start(t, js, "default", "a1", []string{"x"})
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	a1.Reply(func(protocol.Task) protocol.Result { <-hold; return protocol.Result{Status: handagent.Drop} })
	b.submit(t, "job-lost", "name: l\nsteps: [{id: s, action: echo, requires: [x], timeout: 2m}]")
	natstest.Eventually(t, 10*time.Second, "a1 holds the step", func() bool { return len(a1.Received()) == 1 })

	// a1 crashes (no hand-back, no clean delete), and the server goes
	// down before anybody noticed, for longer than the leader's lease.
	a1.Stop()
	r.Down()
	time.Sleep(4 * time.Second) // the outage itself, not a wait for a condition
	r.Up(t)
	handagent.Start(t, js, "default", "a2", []string{"x"})

	natstest.Eventually(t, 30*time.Second, "s succeeds on a2", func() bool {
		st := b.step(t, "job-lost", "s")
		return st != nil && st.State == jobstore.StepSucceeded && st.Actor == "a2"
	})
}

package supervisor_test

import (
	"context"
	"fmt"
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

// restartable is a test server restarted on the same port and store, as
// `kill` and a restart of nats-server would (natstest.Server.Down, Up).
type restartable struct{ *natstest.Server }

func startRestartable(t *testing.T) *restartable { return &restartable{natstest.New(t)} }

// connect returns a connection that keeps reconnecting (agents copy its
// options).
func (r *restartable) connect(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	return r.ConnectReconnecting(t, 100*time.Millisecond)
}

// Issue 15: any nats-server restart made the supervisor fail over the
// whole fleet: the presence watch was silent for 8–10 s, the presence keys
// had expired while the server was down, and health and failover took "I
// could not see" for "the agent is gone". Now, after the gap, the leader
// waits one presence TTL on a fresh view and reads an agent's presence key
// before failing it over: a restart fails over no live agent, and jobs
// keep finishing.
func TestServerRestartFailsOverNoLiveAgent(t *testing.T) {
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
	v, err := supervisor.New(supervisor.Config{SelfHealing: true, CycleInterval: protocol.Duration(200 * time.Millisecond)},
		vnc, testLogger(t, "supervisor"), nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, "supervisor", v.Run)
	for i := range 5 {
		handagent.Start(t, js, "default", fmt.Sprintf("a%d", i), nil)
	}
	<-v.Leading()
	b.submit(t, "job-before", "name: b\nsteps: [{id: s, action: echo}]")
	b.waitSucceeded(t, "job-before")

	// Down for longer than the presence TTL (3 s): every presence key has
	// expired when the server comes back.
	r.Down()
	time.Sleep(4 * time.Second) // the outage itself, not a wait for a condition
	r.Up(t)

	for i := range 5 {
		id := fmt.Sprintf("job-after-%d", i)
		natstest.Eventually(t, 30*time.Second, "submit after the restart", func() bool {
			return b.trySubmit(id, "name: a\nsteps: [{id: s, action: echo}]") == nil
		})
	}
	for i := range 5 {
		b.waitSucceeded(t, fmt.Sprintf("job-after-%d", i))
	}
	// Past the leader's settling period: nobody was failed over.
	time.Sleep(4 * time.Second) // let a wrong failover happen if it would
	if evs := b.events(t, protocol.EventAgentFailed); len(evs) != 0 {
		t.Fatalf("%d agents failed over after a server restart: %+v", len(evs), evs)
	}
	if evs := b.events(t, protocol.EventFailover); len(evs) != 0 {
		t.Fatalf("%d failovers after a server restart: %+v", len(evs), evs)
	}
	for _, e := range b.events(t, protocol.EventHealing) {
		if e.Data["action"] == supervisor.ActionFailover || e.Data["action"] == supervisor.ActionDrain {
			t.Fatalf("healing acted on a live agent after the restart: %+v", e)
		}
	}
}

func (b *bundle) trySubmit(id, body string) error {
	msg := nats.NewMsg(protocol.SubmitSubject(id))
	msg.Data = []byte(body)
	msg.Header.Set(protocol.HeaderJobID, id)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := b.js.PublishMsg(ctx, msg)
	return err
}

func (b *bundle) waitSucceeded(t *testing.T, job string) {
	t.Helper()
	natstest.Eventually(t, 30*time.Second, job+" succeeds", func() bool {
		j, _, err := b.store.Job(context.Background(), job)
		return err == nil && j.State == jobstore.JobSucceeded
	})
}

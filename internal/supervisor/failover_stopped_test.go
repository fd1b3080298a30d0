package supervisor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
)

// stoppable is an agent runtime a test stops gracefully, as SIGTERM does:
// it drains (drain_timeout), hands back what it still runs and deletes its
// presence.
type stoppable struct {
	stop func()
	done chan struct{} // closed when Run returned, with err
	err  error
}

// startStoppable runs agent id of pool default offering action "hold",
// run by h.
func (b *bundle) startStoppable(t *testing.T, id string, h agent.HandlerFunc) *stoppable {
	t.Helper()
	nc, _ := b.srv.Connect(t)
	rt, err := agent.New(agent.Config{ID: id, Pool: "default", DrainTimeout: protocol.Duration(100 * time.Millisecond)},
		agent.WithConn(nc), agent.WithLogger(testLogger(t, "agent "+id)))
	if err != nil {
		t.Fatal(err)
	}
	rt.Handle("hold", h)
	ctx, cancel := context.WithCancel(context.Background())
	s := &stoppable{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.err = rt.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	select {
	case <-rt.Ready():
	case <-s.done:
		t.Fatalf("agent %s did not start: %v", id, s.err)
	case <-time.After(30 * time.Second):
		t.Fatalf("agent %s not ready after 30s", id)
	}
	return s
}

// An agent that stops gracefully gives its running task the drain timeout,
// hands it back and deletes its presence. When the same agent did not come
// back within the failure threshold (a scale-down, a rolling restart under
// new names), the failover moved the task as if the agent had crashed with
// it: a suspect, one more recovery. The third graceful stop parked the step
// as poison and failed the job, though nothing crashed. A clean stop is no
// crash: its tasks in hand count towards poison no more, as for the queues
// healing and operators move off live agents.
//
// Old code: "after graceful stop 3 of agent g3: step dead_lettered (poison:
// taken back from its agent 3 times (last: agent g3 failed)) ...".
func TestGracefulStopsAreNoPoison(t *testing.T) {
	t.Parallel()
	b := setup(t, scheduler.Config{}, supervisor.Config{FailureThreshold: protocol.Duration(300 * time.Millisecond)})
	b.submit(t, "job-stops", "name: stops\nsteps: [{id: s, action: hold, timeout: 2m}]")
	held := make(chan string, 8)
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("g%d", i)
		a := b.startStoppable(t, id, func(ctx context.Context, _ *agent.Task) (any, error) {
			held <- id // then runs until the drain timeout cancels it
			<-ctx.Done()
			return nil, ctx.Err()
		})
		select {
		case got := <-held:
			if got != id {
				t.Fatalf("step held by %s, want %s", got, id)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("agent %s never got the step", id)
		}
		a.stop() // graceful: drain, hand back, delete presence
		<-a.done
		if a.err != nil {
			t.Fatalf("agent %s stopped with %v", id, a.err)
		}
		natstest.Eventually(t, 20*time.Second, "the step is moved off "+id, func() bool {
			st := b.step(t, "job-stops", "s")
			return st != nil && (st.State == jobstore.StepDeadLettered || st.State == jobstore.StepPending && st.TransferredFrom == id)
		})
		if st := b.step(t, "job-stops", "s"); st.State != jobstore.StepPending {
			raw, _ := json.Marshal(st)
			t.Fatalf("after graceful stop %d of agent %s: step %s (%s); want pending: %s", i, id, st.State, st.LastError, raw)
		}
	}
	if st := b.step(t, "job-stops", "s"); st.Recoveries != 0 {
		t.Errorf("%d recoveries counted for three graceful stops, want none", st.Recoveries)
	}
	q, err := dlq.Open(context.Background(), b.nc, b.js)
	if err != nil {
		t.Fatal(err)
	}
	if letters, err := q.List(context.Background(), 0); err != nil || len(letters) != 0 {
		t.Fatalf("dead letters after graceful stops: %+v %v", letters, err)
	}
	// The job still completes on the next agent.
	b.startStoppable(t, "g4", func(context.Context, *agent.Task) (any, error) { return "done", nil })
	b.waitSucceeded(t, "job-stops")
}

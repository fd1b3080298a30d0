package supervisor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// A job's timeout does not rest on the wake its scheduler armed: that
// scheduler may be gone, and a deadline beyond the wake horizon arms none.
// The leader asks for the job at its deadline (the record's
// Warden-Deadline header), and the scheduler that answers times it out.
// Here the job's step runs for a minute on its agent; the scheduler that
// accepted it goes; its deadline is then brought forward to a second from
// now (as if an hour had passed) and the job must fail "timed out" well
// before its step would have ended.
func TestLeaderAsksForAJobAtItsDeadline(t *testing.T) {
	t.Parallel()
	srv, nc, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{srv: srv, nc: nc, js: js, store: store}
	stopFirst := b.scheduler(t, scheduler.Config{})
	v := b.supervisor(t, supervisor.Config{FailureThreshold: protocol.Duration(time.Hour)})
	waitClosed(t, v.Leading(), "the supervisor leads")
	a := agenttest.StartAgent(t, nc, agent.Config{ID: "a1", Pool: "default"})
	a.Script(func(ctx context.Context, _ *agent.Task) (any, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Minute):
			return "ok", nil
		}
	})
	b.submit(t, "job-deadline", `{"name":"d","timeout":"1h","steps":[{"id":"s","action":"echo","timeout":"2m"}]}`)
	natstest.Eventually(t, 10*time.Second, "the step runs", func() bool {
		j, _, err := store.Job(ctx, "job-deadline")
		return err == nil && len(j.Steps) == 1 && j.Steps[0].State == jobstore.StepDispatched
	})
	stopFirst()
	b.scheduler(t, scheduler.Config{})

	j, rev, err := store.Job(ctx, "job-deadline")
	if err != nil {
		t.Fatal(err)
	}
	j.Deadline = time.Now().UTC().Add(time.Second)
	if _, err := store.UpdateJob(ctx, j, rev); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 20*time.Second, "the job fails timed out", func() bool {
		j, _, err := store.Job(ctx, "job-deadline")
		return err == nil && j.State == jobstore.JobFailed && strings.HasPrefix(j.Error, "timed out")
	})
}

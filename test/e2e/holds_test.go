package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
	"github.com/wardenhq/warden/test/procs"
)

// A scheduler holds the messages of jobs waiting for an agent only up to a
// budget per partition (half the consumer's max_ack_pending); past it they
// are acknowledged and the job store alone records the wait. Killed with
// more jobs waiting than that, the scheduler loses nothing: the held ones
// are redelivered to its successor, the others are asked for by the
// supervisor's recovery, and every job runs once its pool has an agent.
func TestWaitingJobsPastTheHoldBudgetSurviveASchedulerKill(t *testing.T) {
	t.Parallel()
	srv, nc, js := natstest.Start(t, streams.Options{Partitions: 1})
	store, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{srv: srv, nc: nc, js: js, store: store}
	dir := t.TempDir()
	schedCfg := filepath.Join(dir, "scheduler.yaml")
	supCfg := filepath.Join(dir, "supervisor.yaml")
	if err := os.WriteFile(schedCfg, []byte("partitions: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(supCfg, []byte("partitions: 1\nrecovery_grace: 1s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	first := procs.Start(t, "scheduler-1", bins["scheduler"], "--server", e.srv.URL, "--config", schedCfg)

	const jobs = 2300 // the budget is 2,048
	var msgs []*nats.Msg
	for i := range jobs {
		msgs = append(msgs, &nats.Msg{Subject: protocol.SubmitSubject(fmt.Sprintf("job-w%04d", i)),
			Data: []byte(`{"name":"w","steps":[{"id":"s","action":"echo","pool":"gpu"}]}`)})
	}
	natstest.PublishAll(t, e.js, msgs...)
	natstest.Eventually(t, 60*time.Second, "every job stored, waiting for the gpu pool", func() bool {
		for i := range jobs {
			j, _, err := e.store.Job(context.Background(), fmt.Sprintf("job-w%04d", i))
			if err != nil || j.State != jobstore.JobPending {
				return false
			}
		}
		return true
	})
	cons, err := e.js.Consumer(context.Background(), protocol.StreamSubmit, "scheduler-submit-0")
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d jobs waiting; %d submissions held unacknowledged", jobs, info.NumAckPending)
	if info.NumAckPending > 2048 {
		t.Fatalf("%d submissions held, more than the budget of 2048", info.NumAckPending)
	}

	first.Kill()
	procs.Start(t, "gpu-1", bins["agent"], "--server", e.srv.URL, "--id", "gpu-1", "--pool", "gpu")
	procs.Start(t, "scheduler-2", bins["scheduler"], "--server", e.srv.URL, "--config", schedCfg)
	procs.Start(t, "supervisor", bins["supervisor"], "--server", e.srv.URL, "--config", supCfg)
	natstest.Eventually(t, 90*time.Second, "every job succeeds", func() bool {
		for i := range jobs {
			j, _, err := e.store.Job(context.Background(), fmt.Sprintf("job-w%04d", i))
			if err != nil || j.State != jobstore.JobSucceeded {
				return false
			}
		}
		return true
	})
}

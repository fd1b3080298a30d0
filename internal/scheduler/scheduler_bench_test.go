package scheduler_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// BenchmarkResultHandling is the scheduler's result path on a real
// (embedded) server, for a job the scheduler has not cached (it did not
// create it): a result for a dispatched step is published, the scheduler
// loads the job (one direct get and one batched get), applies the result
// and writes the step and then the job's terminal record (pipelined CAS).
// One op is one result applied and its job's terminal record seen. Allocations include the embedded server's, which shares the
// process.
func BenchmarkResultHandling(b *testing.B) {
	_, nc, js := natstest.Start(b, streams.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := scheduler.New(scheduler.DefaultConfig(), nc, scheduler.WithLogger(zerolog.Nop()))
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	natstest.Eventually(b, 10*time.Second, "scheduler consumer", func() bool {
		_, err := js.Consumer(ctx, protocol.StreamSubmit, "scheduler-submit-bare")
		return err == nil
	})
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		b.Fatal(err)
	}
	finished := make(chan struct{}, 1<<16)
	// A job's terminal record is its completion signal: every job-store
	// write is a message on $KV.warden_jobs.<key> carrying Warden-State.
	sub, err := nc.Subscribe("$KV."+protocol.BucketJobs+".job.>", func(m *nats.Msg) {
		if m.Header.Get(protocol.HeaderRecordState) == string(jobstore.JobSucceeded) {
			finished <- struct{}{}
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	sp := spec.Job{Name: "bench", Steps: []spec.Step{{ID: "s", Action: "noop"}}}
	now := time.Now().UTC()
	next := 0
	b.ReportAllocs()
	for b.Loop() {
		// The job and its dispatched step, written before the clock starts.
		b.StopTimer()
		id := fmt.Sprintf("job-%d", next)
		next++
		storeRunningJob(b, store, id, sp, now)
		m := agentResult(id, "s", now)
		b.StartTimer()
		if _, err := js.PublishMsg(ctx, m); err != nil {
			b.Fatal(err)
		}
		select {
		case <-finished:
		case <-time.After(10 * time.Second):
			b.Fatalf("job %s did not finish", id)
		}
	}
}

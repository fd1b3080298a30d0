package scheduler_test

import (
	"context"
	"encoding/json"
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
	// Dispatched steps, written before the clock starts.
	prepare := func(n, from int) {
		for i := from; i < from+n; i++ {
			id := fmt.Sprintf("job-%d", i)
			job := jobstore.NewJob(id, sp, now)
			job.State = jobstore.JobRunning
			if _, err := store.CreateJob(ctx, job); err != nil {
				b.Fatal(err)
			}
			sts, _ := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
			_ = sts[0].Dispatch("agent-1", "", now, time.Hour)
			if _, err := store.CreateStep(ctx, sts[0]); err != nil {
				b.Fatal(err)
			}
		}
	}
	next := 0
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		prepare(1, next)
		id := fmt.Sprintf("job-%d", next)
		next++
		r := protocol.Result{JobID: id, StepID: "s", Epoch: 1, Agent: "agent-1", Status: protocol.ResultSucceeded, StartedAt: now, FinishedAt: now}
		body, _ := json.Marshal(r)
		m := nats.NewMsg(protocol.ResultSubject("default", "agent-1", id, "s"))
		m.Data = body
		m.Header.Set(protocol.HeaderJob, id)
		m.Header.Set(protocol.HeaderStep, "s")
		m.Header.Set(protocol.HeaderEpoch, "1")
		m.Header.Set(protocol.HeaderMsgID, protocol.ResultMsgID(id, "s", 1, ""))
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

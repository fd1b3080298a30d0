package supervisor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// putFinishedJobs writes n finished job records as the job store writes
// them: a small body and the record headers the recovery index reads.
func putFinishedJobs(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	created := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano)
	var acks []jetstream.PubAckFuture
	for i := range n {
		id := fmt.Sprintf("job-done-%05d", i)
		m := nats.NewMsg("$KV." + protocol.BucketJobs + "." + protocol.JobKey(id))
		m.Data = []byte(`{"id":"` + id + `","state":"succeeded","desired":"succeeded"}`)
		m.Header.Set(protocol.HeaderRecordState, string(jobstore.JobSucceeded))
		m.Header.Set(protocol.HeaderRecordDesired, string(jobstore.JobSucceeded))
		m.Header.Set(protocol.HeaderRecordCreated, created)
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, f)
		if len(acks) == 1000 || i == n-1 {
			for _, f := range acks {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					t.Fatal(err)
				case <-time.After(30 * time.Second):
					t.Fatal("no PubAck in 30s")
				}
			}
			acks = acks[:0]
		}
	}
}

// Issue 14: after 20,000 finished jobs a freshly started supervisor leads
// at once: its recovery index is built from record headers only (finished
// records are not even kept). A record written without the headers (the
// step record below) is still read, from five decoded fields, and its
// expired lease is recovered.
func TestLeadsOverTwentyThousandFinishedJobsFromHeaders(t *testing.T) {
	t.Parallel()
	srv, nc, js := natstest.Start(t, streams.Options{})
	_ = srv
	store, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	putFinishedJobs(t, js, 20_000)
	// One unfinished job whose step's lease ended long ago, on an agent
	// that is gone, written without record headers.
	ctx := context.Background()
	now := time.Now().UTC()
	sp := spec.Job{Name: "old", Steps: []spec.Step{{ID: "s", Action: "echo"}}}
	job := jobstore.NewJob("job-stuck", sp, now.Add(-time.Hour))
	job.State = jobstore.JobRunning
	steps, err := jobstore.NewSteps(job.ID, sp, jobstore.StepDefaults{Timeout: time.Minute}, now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := steps[0].Dispatch("gone", protocol.NewLeaseToken(), now.Add(-time.Hour), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := store.CreateJob(ctx, job); err != nil {
		t.Fatal(err)
	}
	// The step record as written before record headers existed.
	body, _ := json.Marshal(steps[0])
	if _, err := store.KV().Put(ctx, protocol.StepKey(job.ID, "s"), body); err != nil {
		t.Fatal(err)
	}

	b := &bundle{srv: srv, nc: nc, js: js, store: store}
	start := time.Now()
	v := b.supervisor(t, supervisor.Config{FailureThreshold: protocol.Duration(time.Hour)})
	select {
	case <-v.Leading():
	case <-time.After(60 * time.Second):
		t.Fatal("not leading after 60s")
	}
	t.Logf("leading %s after start, over 20,000 finished jobs", time.Since(start).Round(time.Millisecond))
	natstest.Eventually(t, 20*time.Second, "the expired lease is recovered", func() bool {
		st := b.step(t, "job-stuck", "s")
		return st != nil && st.State == jobstore.StepPending && st.Attempts[0].Status == "lease_expired"
	})
}

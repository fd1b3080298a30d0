package supervisor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
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

// writeHistory leaves n finished jobs in the store the way schedulers leave
// them: each record written three times (accepted, dispatched, finished with
// its retention TTL), so that the bucket's stream (history 1) is sparse, and
// every fourth job with three step records of its own beside its record.
func writeHistory(t *testing.T, store *jobstore.Store, prefix string, n int) {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC().Add(-time.Hour)
	sp1 := spec.Job{Name: "one", Steps: []spec.Step{{ID: "s", Action: "noop"}}}
	sp3 := spec.Job{Name: "three", Steps: []spec.Step{{ID: "a", Action: "noop"}, {ID: "b", Action: "noop"}, {ID: "c", Action: "noop"}}}
	const chunk = 500
	for lo := 0; lo < n; lo += chunk {
		type rec struct {
			job   *jobstore.Job
			steps []*jobstore.Step
			revs  []uint64 // the job's, then each step's
		}
		var recs []*rec
		for i := lo; i < min(lo+chunk, n); i++ {
			sp := sp1
			if i%4 == 3 {
				sp = sp3
			}
			j := jobstore.NewJob(fmt.Sprintf("%s-%05d", prefix, i), sp, now)
			steps, err := jobstore.NewSteps(j.ID, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
			if err != nil {
				t.Fatal(err)
			}
			r := &rec{job: j, steps: steps}
			if len(steps) == 1 {
				j.Inline, j.Steps, r.steps = true, steps, nil
			}
			recs = append(recs, r)
		}
		round := func(change func(r *rec)) {
			b := store.Batch()
			for _, r := range recs {
				change(r)
				rev := uint64(0)
				if len(r.revs) > 0 {
					rev = r.revs[0]
				}
				b.Add(store.JobWrite(r.job, rev))
				for i, st := range r.steps {
					rev = 0
					if len(r.revs) > 0 {
						rev = r.revs[1+i]
					}
					b.Add(store.StepWrite(st, rev))
				}
			}
			res := b.Wait(ctx)
			k := 0
			for _, r := range recs {
				r.revs = r.revs[:0]
				for range 1 + len(r.steps) {
					if res[k].Err != nil {
						t.Fatal(res[k].Err)
					}
					r.revs = append(r.revs, res[k].Rev)
					k++
				}
			}
		}
		round(func(*rec) {})
		round(func(r *rec) {
			r.job.State = jobstore.JobRunning
			for _, st := range append(r.steps, r.job.Steps...) {
				if err := st.Dispatch("agent-1", protocol.NewLeaseToken(), now, 0); err != nil {
					t.Fatal(err)
				}
			}
		})
		round(func(r *rec) {
			r.job.State = jobstore.JobSucceeded
			for _, st := range append(r.steps, r.job.Steps...) {
				st.State = jobstore.StepSucceeded
			}
		})
	}
}

// Issue 14: a freshly started supervisor over a store full of finished jobs
// still finds every kind of unfinished work written among them: a step
// record and an inline step whose leases ended (released), a pending step
// record, and a job a scheduler died writing (its record, no step records
// yet): for the last two it asks a scheduler to advance the job.
func TestFreshSupervisorFindsUnfinishedWorkAmongFinishedJobs(t *testing.T) {
	t.Parallel()
	srv, nc, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	// A scheduler stand-in: it records what it is asked to advance.
	var mu sync.Mutex
	asked := map[string]bool{}
	sub, err := nc.Subscribe(protocol.SubjectControlAdvance, func(m *nats.Msg) {
		mu.Lock()
		asked[string(m.Data)] = true
		mu.Unlock()
		_ = m.Respond(protocol.OKReply("advanced"))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	writeHistory(t, store, "done-a", 2000)
	now := time.Now().UTC()
	long := now.Add(-time.Hour)
	sp2 := spec.Job{Name: "two", Steps: []spec.Step{{ID: "a", Action: "noop"}, {ID: "b", Action: "noop"}}}
	newJob := func(id string, sp spec.Job) (*jobstore.Job, []*jobstore.Step) {
		j := jobstore.NewJob(id, sp, long)
		j.State = jobstore.JobRunning
		steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, long)
		if err != nil {
			t.Fatal(err)
		}
		return j, steps
	}
	// A step record whose lease ended an hour ago, its sibling finished.
	j, steps := newJob("job-lease", sp2)
	if _, err := store.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	steps[0].State = jobstore.StepSucceeded
	if err := steps[1].Dispatch("gone", protocol.NewLeaseToken(), long, 0); err != nil {
		t.Fatal(err)
	}
	for _, st := range steps {
		if _, err := store.CreateStep(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	// An inline step whose lease ended.
	j, steps = newJob("job-inline", spec.Job{Name: "one", Steps: []spec.Step{{ID: "s", Action: "noop"}}})
	if err := steps[0].Dispatch("gone", protocol.NewLeaseToken(), long, 0); err != nil {
		t.Fatal(err)
	}
	j.Inline, j.Steps = true, steps
	if _, err := store.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	// A pending step record no scheduler dispatched.
	j, steps = newJob("job-pending", sp2)
	if _, err := store.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	if _, err := store.CreateStep(ctx, steps[0]); err != nil {
		t.Fatal(err)
	}
	// A job whose scheduler died after writing its record, before its steps.
	j, _ = newJob("job-midway", sp2)
	if _, err := store.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	writeHistory(t, store, "done-b", 2000)

	b := &bundle{srv: srv, nc: nc, js: js, store: store}
	v := b.supervisor(t, supervisor.Config{FailureThreshold: protocol.Duration(time.Hour),
		RecoveryGrace: protocol.Duration(200 * time.Millisecond)})
	select {
	case <-v.Leading():
	case <-time.After(60 * time.Second):
		t.Fatal("not leading after 60s")
	}
	released := func(job, step string) func() bool {
		return func() bool {
			st := b.step(t, job, step)
			return st != nil && st.State == jobstore.StepPending && len(st.Attempts) > 0 &&
				st.Attempts[len(st.Attempts)-1].Status == "lease_expired"
		}
	}
	natstest.Eventually(t, 20*time.Second, "the step record's expired lease is recovered", released("job-lease", "b"))
	natstest.Eventually(t, 20*time.Second, "the inline step's expired lease is recovered", released("job-inline", "s"))
	for _, job := range []string{"job-pending", "job-midway", "job-lease", "job-inline"} {
		natstest.Eventually(t, 20*time.Second, "a scheduler is asked to advance "+job, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return asked[job]
		})
	}
	mu.Lock()
	defer mu.Unlock()
	for job := range asked {
		if strings.HasPrefix(job, "done-") {
			t.Errorf("asked to advance finished job %s", job)
		}
	}
}

// A recovery round asks about its due jobs side by side: a scheduler that
// swallows asks (blackholed, still in the queue group) held each for the
// advance_timeout, and with one ask at a time a round of many stalled jobs
// waited minutes behind it. The stand-in below answers nothing until it
// holds every job's ask at once.
func TestRecoveryAsksAboutStalledJobsSideBySide(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	ctx, store := context.Background(), b.store
	const jobs = 16
	long := time.Now().UTC().Add(-time.Hour)
	sp := spec.Job{Name: "two", Steps: []spec.Step{{ID: "a", Action: "noop"}, {ID: "b", Action: "noop"}}}
	for i := range jobs {
		id := fmt.Sprintf("stalled-%02d", i)
		j := jobstore.NewJob(id, sp, long)
		j.State = jobstore.JobRunning
		steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, long)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
		if _, err := store.CreateStep(ctx, steps[0]); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	held := map[string]*nats.Msg{}
	most, twice := 0, ""
	sub, err := b.nc.Subscribe(protocol.SubjectControlAdvance, func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		if held[string(m.Data)] != nil {
			twice = string(m.Data)
		}
		held[string(m.Data)] = m
		most = max(most, len(held))
		if len(held) < jobs {
			return
		}
		for _, h := range held {
			_ = h.Respond(protocol.OKReply("advanced"))
		}
		clear(held)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	b.supervisor(t, supervisor.Config{FailureThreshold: protocol.Duration(time.Hour),
		RecoveryGrace: protocol.Duration(200 * time.Millisecond), AdvanceTimeout: protocol.Duration(time.Minute)})
	defer func() {
		if t.Failed() {
			mu.Lock()
			defer mu.Unlock()
			t.Logf("at most %d asks were outstanding at once", most)
		}
	}()
	natstest.Eventually(t, 30*time.Second, fmt.Sprintf("all %d stalled jobs asked about at once", jobs), func() bool {
		mu.Lock()
		defer mu.Unlock()
		return most == jobs
	})
	mu.Lock()
	defer mu.Unlock()
	if twice != "" {
		t.Fatalf("job %s was asked about again while its first ask was unanswered", twice)
	}
}

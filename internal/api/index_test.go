package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/api"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natsconn"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// indexFollowers counts the job index's consumers on the jobs stream
// (headers only, on the job keys alone, from a sequence).
func indexFollowers(t *testing.T, js jetstream.JetStream) int {
	t.Helper()
	s, err := js.Stream(ctx(t), "KV_"+protocol.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for ci := range s.ListConsumers(ctx(t)).Info() {
		c := ci.Config
		filter := c.FilterSubject
		if len(c.FilterSubjects) == 1 {
			filter = c.FilterSubjects[0]
		}
		if c.HeadersOnly && c.DeliverPolicy == jetstream.DeliverByStartSequencePolicy && strings.HasSuffix(filter, ".job.*") {
			n++
		}
	}
	return n
}

// `warden api` (Run) answers GET /api/v1/jobs and the micro jobs.list
// from its job index: the same pages as the scan (ops.ListJobs on a store
// without one), a job written just before a listing in it; its index's
// follower goes away with it.
func TestRunListsJobsFromItsIndex(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	nc, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{TaskShards: 1})
	plain, err := jobstore.Open(ctx(t), js)
	if err != nil {
		t.Fatal(err)
	}
	scan := ops.New(nc, plain)
	base := time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)
	mk := func(i int, created time.Time, state jobstore.JobState) string {
		t.Helper()
		id := fmt.Sprintf("job-%03d", i)
		j := jobstore.NewJob(id, spec.Job{Name: id, Steps: []spec.Step{{ID: "a", Action: "echo"}}}, created)
		j.State = state
		if _, err := plain.CreateJob(ctx(t), j); err != nil {
			t.Fatal(err)
		}
		return id
	}
	states := []jobstore.JobState{jobstore.JobSucceeded, jobstore.JobRunning, jobstore.JobFailed}
	for i := range 60 {
		mk(i, base.Add(time.Duration(i)*time.Minute), states[i%len(states)])
	}

	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	addr := make(chan string, 1)
	done := make(chan error, 1)
	cfg := api.Config{NATS: natsconn.Options{URL: srv.URL}, Listen: "127.0.0.1:0", AnonymousScope: api.ScopeRead}
	go func() { done <- api.Run(runCtx, cfg, zerolog.Nop(), func(a string) { addr <- a }) }()
	var url string
	select {
	case a := <-addr:
		url = "http://" + a
	case err := <-done:
		t.Fatalf("run: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the API did not start")
	}
	natstest.Eventually(t, 20*time.Second, "the API's job index follows the job keys", func() bool { return indexFollowers(t, js) == 1 })

	get := func(query string) []byte {
		t.Helper()
		res, err := http.Get(url + "/api/v1/jobs?" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("?%s: %d %s", query, res.StatusCode, b)
		}
		return b
	}
	compare := func(query string, f jobstore.ListFilter) ops.JobsPage {
		t.Helper()
		got := get(query)
		want, err := scan.ListJobs(ctx(t), f)
		if err != nil {
			t.Fatal(err)
		}
		var gp ops.JobsPage
		if err := json.Unmarshal(got, &gp); err != nil {
			t.Fatal(err)
		}
		g, _ := json.Marshal(gp)
		w, _ := json.Marshal(want)
		if !bytes.Equal(g, w) {
			t.Fatalf("?%s:\nAPI  %.400s\nscan %.400s", query, g, w)
		}
		return gp
	}
	p := compare("limit=7", jobstore.ListFilter{Limit: 7})
	compare("limit=7&cursor="+p.Next, jobstore.ListFilter{Limit: 7, Cursor: p.Next})
	compare("state=running,failed&limit=11", jobstore.ListFilter{States: []jobstore.JobState{jobstore.JobRunning, jobstore.JobFailed}, Limit: 11})
	compare("created_after=2026-11-27T08:30:00Z&created_before=2026-11-27T08:45:00Z",
		jobstore.ListFilter{CreatedAfter: base.Add(30 * time.Minute), CreatedBefore: base.Add(45 * time.Minute)})

	// Written, then listed at once: there.
	id := mk(60, time.Now().UTC(), jobstore.JobPending)
	p = compare("limit=1", jobstore.ListFilter{Limit: 1})
	if len(p.Jobs) != 1 || p.Jobs[0].ID != id || p.Matched != 61 || p.Counts[jobstore.JobPending] != 1 {
		t.Fatalf("a job written before the listing: %+v", p)
	}
	// The micro endpoint runs on the same store.
	m, err := nc.Request(ops.MicroSubject(ops.ServiceAPI, "jobs", "list", false), []byte(`{"states": ["pending"]}`), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var mp ops.JobsPage
	if err := json.Unmarshal(m.Data, &mp); err != nil || len(mp.Jobs) != 1 || mp.Jobs[0].ID != id {
		t.Fatalf("jobs.list: %s %v", m.Data, err)
	}

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the API did not stop")
	}
	if n := indexFollowers(t, js); n != 0 {
		t.Fatalf("%d index followers left after the API stopped", n)
	}
}

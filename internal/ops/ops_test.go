package ops_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

// TestCodes: one classification gives the CLI exit code, the HTTP status
// and the micro error code.
func TestCodes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		err    error
		code   ops.Code
		exit   int
		status int
	}{
		{fmt.Errorf("x: %w", spec.ErrInvalid), ops.CodeInvalid, 2, 400},
		{jobstore.ErrBadCursor, ops.CodeInvalid, 2, 400},
		{fmt.Errorf("x: %w", client.ErrRejected), ops.CodeRejected, 2, 400},
		{fmt.Errorf("x: %w", ops.ErrFinished), ops.CodeConflict, 2, 409},
		{dlq.ErrWrongState, ops.CodeConflict, 2, 409},
		{jobstore.ErrConflict, ops.CodeConflict, 2, 409},
		{fmt.Errorf("x: %w", jobstore.ErrNotFound), ops.CodeNotFound, 3, 404},
		{dlq.ErrNotFound, ops.CodeNotFound, 3, 404},
		{client.ErrNotFound, ops.CodeNotFound, 3, 404},
		{context.DeadlineExceeded, ops.CodeTimeout, 4, 504},
		{nats.ErrNoResponders, ops.CodeUnavailable, 4, 503},
		{jetstream.ErrStreamNotFound, ops.CodeUnavailable, 4, 503},
		{errors.New("boom"), ops.CodeInternal, 4, 500},
		{fmt.Errorf("agent: %w", protocol.NewReplyError(protocol.CodeNotFound, "no step")), ops.CodeNotFound, 3, 404},
		{protocol.NewReplyError(protocol.CodeInvalidRequest, "bad"), ops.CodeInvalid, 2, 400},
		// "Asking again later may work" (a reviewer: it was 500 internal).
		{fmt.Errorf("failover: %w", protocol.NewReplyError(protocol.CodeFailed, "task stream: timeout")), ops.CodeUnavailable, 4, 503},
		{ops.Errorf(ops.CodeForbidden, "no"), ops.CodeForbidden, 4, 403},
		{ops.Errorf(ops.CodeUnauthenticated, "no"), ops.CodeUnauthenticated, 4, 401},
		{ops.Errorf(ops.CodeTooLarge, "no"), ops.CodeTooLarge, 2, 413},
	}
	for _, c := range cases {
		got := ops.CodeOf(c.err)
		if got != c.code || got.ExitCode() != c.exit || got.HTTPStatus() != c.status {
			t.Errorf("%v: %s exit %d status %d, want %s %d %d", c.err, got, got.ExitCode(), got.HTTPStatus(), c.code, c.exit, c.status)
		}
	}
	if ops.CodeOf(nil) != "" {
		t.Error("nil has a code")
	}
	wrapped := fmt.Errorf("outer: %w", ops.Errorf(ops.CodeNotFound, "job %s: %w", "x", jobstore.ErrNotFound))
	if ops.CodeOf(wrapped) != ops.CodeNotFound || !errors.Is(wrapped, jobstore.ErrNotFound) {
		t.Errorf("wrapped *ops.Error: %s", ops.CodeOf(wrapped))
	}
}

// serviceInfos asks every micro service for its info ($SRV.INFO) and
// returns them by name once want services answered.
func serviceInfos(t *testing.T, nc *nats.Conn, want ...string) map[string]micro.Info {
	t.Helper()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	subj, _ := micro.ControlSubject(micro.InfoVerb, "", "")
	if err := nc.PublishRequest(subj, inbox, nil); err != nil {
		t.Fatal(err)
	}
	got := map[string]micro.Info{}
	deadline := time.Now().Add(5 * time.Second)
	for {
		missing := false
		for _, w := range want {
			if _, ok := got[w]; !ok {
				missing = true
			}
		}
		if !missing {
			return got
		}
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			t.Fatalf("services answering $SRV.INFO: %v; want %v (%v)", keys(got), want, err)
		}
		var info micro.Info
		if err := json.Unmarshal(m.Data, &info); err != nil {
			t.Fatal(err)
		}
		got[info.Name] = info
	}
}

func keys(m map[string]micro.Info) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// apiMicro starts a server with the streams and registers the API's micro
// service, with its admin endpoints, on a connection to it; the service
// stops when the test ends.
func apiMicro(t *testing.T) (*nats.Conn, *jobstore.Store, micro.Service) {
	t.Helper()
	srv := natstest.New(t)
	nc, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{TaskShards: 1})
	st, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := ops.RegisterMicro(nc, ops.New(nc, st), ops.ServiceAPI, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	return nc, st, svc
}

// TestMicroServices lists the scheduler's, supervisor's and API's micro
// services through the micro API (what `nats micro ls` does), calls a read
// endpoint, and checks an error carries the stable code and counts in the
// endpoint's stats.
func TestMicroServices(t *testing.T) {
	t.Parallel()
	nc, _, svc := apiMicro(t)
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, p := range []string{ops.ServiceScheduler, ops.ServiceSupervisor} {
		if err := ops.StartService(c, nc, p); err != nil {
			t.Fatal(err)
		}
	}

	infos := serviceInfos(t, nc, "warden-api", "warden-scheduler", "warden-supervisor")
	endpoints := func(name string) map[string]string {
		out := map[string]string{}
		for _, e := range infos[name].Endpoints {
			out[e.Name] = e.Subject
		}
		return out
	}
	api, sched := endpoints("warden-api"), endpoints("warden-scheduler")
	if api["jobs_list"] != "warden.ops.api.jobs.list" || api["admin_dlq_retry"] != "warden.ops.api.admin.dlq.retry" {
		t.Fatalf("warden-api endpoints: %v", api)
	}
	if sched["jobs_list"] != "warden.ops.scheduler.jobs.list" || sched["admin_jobs_cancel"] != "" {
		t.Fatalf("warden-scheduler endpoints (read only): %v", sched)
	}
	t.Logf("warden-api: %d endpoints, warden-scheduler: %d, warden-supervisor: %d", len(api), len(sched), len(endpoints("warden-supervisor")))

	// A read.
	m, err := nc.Request("warden.ops.scheduler.jobs.list", []byte(`{"limit": 5}`), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var page ops.JobsPage
	if err := json.Unmarshal(m.Data, &page); err != nil || m.Header.Get(micro.ErrorCodeHeader) != "" {
		t.Fatalf("jobs.list: %s %v %v", m.Data, m.Header, err)
	}
	// An error: not found, with the API's error shape.
	m, err = nc.Request("warden.ops.api.jobs.show", []byte(`{"id": "job-nope"}`), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(micro.ErrorCodeHeader) != fmt.Sprint(http.StatusNotFound) || !json.Valid(m.Data) {
		t.Fatalf("jobs.show of a missing job: %v %s", m.Header, m.Data)
	}
	var e struct {
		Error struct{ Code ops.Code } `json:"error"`
	}
	if json.Unmarshal(m.Data, &e); e.Error.Code != ops.CodeNotFound {
		t.Fatalf("error body %s", m.Data)
	}
	// micro counts a request after its handler returns, which is after
	// the reply was sent: wait for the count rather than read it at once.
	var shown *micro.EndpointStats
	natstest.Eventually(t, 5*time.Second, "jobs_show counts the error", func() bool {
		for _, es := range svc.Stats().Endpoints {
			if es.Name == "jobs_show" {
				shown = es
				return es.NumRequests == 1
			}
		}
		return false
	})
	if shown.NumErrors != 1 {
		t.Fatalf("jobs_show stats: %+v", shown)
	}
}

func TestErrorText(t *testing.T) {
	t.Parallel()
	if got := ops.Errorf(ops.CodeNotFound, "job %s: %w", "x", jobstore.ErrNotFound).Error(); got != "job x: not found" {
		t.Errorf("Errorf: %q", got)
	}
	if got := (&ops.Error{Code: ops.CodeInvalid, Msg: "malformed JSON", Err: errors.New("eof")}).Error(); got != "malformed JSON: eof" {
		t.Errorf("Error: %q", got)
	}
}

// TestQueuesCountTasksNotTheAnchor: a task stream's depth is its tasks; the
// anchor the supervisor keeps there (protocol.AnchorSubject) is no task.
func TestQueuesCountTasksNotTheAnchor(t *testing.T) {
	t.Parallel()
	o, js, ctx := newOps(t)
	for _, subj := range []string{protocol.TaskSubject(0, "pool", "a"), protocol.TaskSubject(0, "pool", "a"), protocol.TaskSubject(0, "pool", "b"),
		protocol.AnchorSubject(protocol.TaskStream(0))} {
		if _, err := js.Publish(ctx, subj, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	q, err := o.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Tasks) != 1 || q.Tasks[0].Messages != 3 || q.TasksTotal != 3 || len(q.Tasks[0].Subjects) != 2 {
		t.Fatalf("queues %+v: want one stream with 3 tasks for 2 agents", q)
	}
}

// warden agent drain of an agent that is not there said NATS did not
// answer (exit 4) where the HTTP route says 404 (exit 3): it is not found.
func TestControlOfAnAbsentAgentIsNotFound(t *testing.T) {
	t.Parallel()
	o, _, ctx := newOps(t)
	err := o.DrainAgent(ctx, "default", "gone")
	if c := ops.CodeOf(err); c != ops.CodeNotFound || c.ExitCode() != 3 {
		t.Fatalf("drain of an absent agent: %v (%s)", err, c)
	}
}

// newOps is an Ops on a fresh server with one task shard, and a context
// that ends with the test (10 s at most).
func newOps(t *testing.T) (*ops.Ops, jetstream.JetStream, context.Context) {
	t.Helper()
	_, nc, js := natstest.Start(t, streams.Options{TaskShards: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	return ops.New(nc, store), js, ctx
}

// A micro request names its own reply subject and the answer goes out with
// the answering process's permissions: an endpoint answers only on an
// inbox. Before, a reader could have the API (whose identity may write the
// job store) write an answer over a job record.
func TestMicroEndpointsAnswerOnlyOnAnInbox(t *testing.T) {
	t.Parallel()
	nc, st, _ := apiMicro(t)
	c := context.Background()
	sink, err := nc.SubscribeSync("evil.sink")
	if err != nil {
		t.Fatal(err)
	}
	for _, to := range []string{"$KV." + protocol.BucketJobs + ".job.victim", "evil.sink"} {
		if err := nc.PublishRequest("warden.ops.api.overview.get", to, nil); err != nil {
			t.Fatal(err)
		}
	}
	// One endpoint's requests are handled in order: once this one is
	// answered, the two before it were handled.
	if _, err := nc.Request("warden.ops.api.overview.get", nil, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := sink.Pending(); n != 0 {
		t.Fatalf("%d answers published on evil.sink", n)
	}
	if _, _, err := st.Job(c, "victim"); !errors.Is(err, jobstore.ErrNotFound) {
		t.Fatalf("job.victim: %v, want not found (an answer was written as a job record)", err)
	}
}

// A cluster changed meanwhile (a concurrent update or delete) is a
// conflict (409), not an internal error (500).
func TestClusterChangedIsAConflict(t *testing.T) {
	t.Parallel()
	if c := ops.CodeOf(fmt.Errorf("web: %w", cluster.ErrChanged)); c != ops.CodeConflict {
		t.Fatalf("CodeOf(ErrChanged) = %s, want %s", c, ops.CodeConflict)
	}
}

// A retry that reopened a step and then failed to reopen its job leaves a
// finished job with a pending step, which nothing runs; the next retry of
// the job finishes the reopening rather than saying there is nothing to
// retry.
func TestRetryFinishesAStrandedReopen(t *testing.T) {
	t.Parallel()
	_, nc, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	sp := spec.Job{Name: "r", Steps: []spec.Step{{ID: "a", Action: "echo"}, {ID: "b", Action: "echo", DependsOn: []string{"a"}}}}
	now := time.Now().UTC()
	job := jobstore.NewJob("job-stranded", sp, now)
	job.State, job.Error, job.FinishedAt = jobstore.JobFailed, "step b failed", now
	steps, err := jobstore.NewSteps(job.ID, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	steps[0].State, steps[0].FinishedAt = jobstore.StepSucceeded, now // b: pending, reopened
	if _, err := store.CreateJob(ctx, job); err != nil {
		t.Fatal(err)
	}
	for _, st := range steps {
		if _, err := store.CreateStep(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	reopened, err := ops.New(nc, store).RetryJob(ctx, job.ID)
	if err != nil || len(reopened) != 1 || reopened[0] != "b" {
		t.Fatalf("retry of a job with a stranded reopened step: %v, %v", reopened, err)
	}
	j, _, err := store.Job(ctx, job.ID)
	if err != nil || j.State != jobstore.JobRunning {
		t.Fatalf("job after the retry: %v %v", j.State, err)
	}
}

// A submission whose outcome is unknown is a timeout whatever cut the wait
// (the caller's cancel, a closed connection): the job may be stored, and
// the micro endpoint and the CLI answer as the HTTP API does.
func TestOutcomeUnknownIsATimeout(t *testing.T) {
	for _, cause := range []error{context.Canceled, context.DeadlineExceeded, nats.ErrConnectionClosed} {
		err := fmt.Errorf("submit: %w", &client.OutcomeUnknownError{JobID: "job-x", Err: cause})
		if got := ops.CodeOf(err); got != ops.CodeTimeout {
			t.Errorf("outcome unknown after %v: code %s, want %s", cause, got, ops.CodeTimeout)
		}
	}
}

package api_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/api"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// concrete fills a route pattern's wildcards.
func concrete(path string) string {
	return strings.NewReplacer("{pool}", "default", "{id}", "1", "{name}", "c1").Replace(path)
}

func wantError(t *testing.T, name string, r response, status int, code ops.Code) {
	t.Helper()
	var e api.ErrorBody
	if r.status != status {
		t.Errorf("%s: status %d, want %d (%s)", name, r.status, status, r.body)
		return
	}
	if err := jsonUnmarshal(r.body, &e); err != nil || e.Error.Code != code || e.Error.Status != status || e.Error.Message == "" {
		t.Errorf("%s: body %s, want code %s (%v)", name, r.body, code, err)
	}
}

// TestAuthAndLimitsOnEveryRoute: every route but the OpenAPI document
// refuses a request without a token (401) or with an unknown one (401),
// every admin route refuses a read token (403), and every route refuses a
// body over the limit (413), each in the error shape.
func TestAuthAndLimitsOnEveryRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	big := []byte(strings.Repeat("x", 5000))
	for _, rt := range api.Routes() {
		p := concrete(rt.Path)
		name := rt.Method + " " + rt.Path
		if rt.Scope == api.ScopeNone {
			if r := b.call(t, rt.Method, p, "", nil); r.status != http.StatusOK {
				t.Errorf("%s without a token: %d", name, r.status)
			}
			continue
		}
		r := b.call(t, rt.Method, p, "", nil)
		wantError(t, name+" without a token", r, http.StatusUnauthorized, ops.CodeUnauthenticated)
		if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: no WWW-Authenticate challenge", name)
		}
		wantError(t, name+" with an unknown token", b.call(t, rt.Method, p, "not-a-known-token-at-all", nil), http.StatusUnauthorized, ops.CodeUnauthenticated)
		if rt.Scope == api.ScopeAdmin {
			wantError(t, name+" with a read token", b.call(t, rt.Method, p, readToken, nil), http.StatusForbidden, ops.CodeForbidden)
		}
		wantError(t, name+" with an oversized body", b.call(t, rt.Method, p, adminToken, big), http.StatusRequestEntityTooLarge, ops.CodeTooLarge)
	}
	wantError(t, "unknown route", b.call(t, "GET", "/api/v1/nope", readToken, nil), http.StatusNotFound, ops.CodeNotFound)
}

// TestAnonymousScope: anonymous_scope read lets reads through without a
// token and still refuses actions.
func TestAnonymousScope(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *api.Config) { c.AnonymousScope = api.ScopeRead })
	if r := b.call(t, "GET", "/api/v1/jobs", "", nil); r.status != http.StatusOK {
		t.Fatalf("anonymous read: %d %s", r.status, r.body)
	}
	wantError(t, "anonymous cancel", b.call(t, "POST", "/api/v1/jobs/x/cancel", "", nil), http.StatusForbidden, ops.CodeForbidden)
}

// TestRoutes calls every route for success and, where the route has
// them, a validation error, a missing target and a conflict.
func TestRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.confirmSubmissions(t)
	S, F, P, D := jobstore.StepSucceeded, jobstore.StepFailed, jobstore.StepPending, jobstore.StepDeadLettered
	b.job(t, "job-ok", jobstore.JobSucceeded, S, S)
	b.job(t, "job-failed", jobstore.JobFailed, S, F)
	b.job(t, "job-run", jobstore.JobRunning, S, P)
	b.job(t, "job-run2", jobstore.JobRunning, P)
	b.job(t, "job-dl", jobstore.JobFailed, D)
	letter := b.deadLetter(t, "job-dl", "a")
	stale := b.deadLetter(t, "job-ok", "a")
	b.agent(t, "default", "agent-1")
	b.agent(t, "default", "agent-2")
	b.event(t, protocol.Event{Kind: "healing", ID: "h1", Agent: "agent-1", Reason: "error rate", Data: map[string]string{"action": "deprioritise"}})
	b.event(t, protocol.Event{Kind: "failover", ID: "f1", Agent: "agent-3", Reason: "presence expired"})
	// agent-2 has no assessment.
	if kv, err := b.js.KeyValue(ctx(t), protocol.BucketHealth); err == nil {
		_ = kv.Delete(ctx(t), "default.agent-2")
	}

	ok := func(name, method, path, token string, body []byte, status int, check func(response) bool) {
		t.Helper()
		r := b.call(t, method, path, token, body)
		if r.status != status || (check != nil && !check(r)) {
			t.Errorf("%s: %d %s", name, r.status, r.body)
		}
	}
	has := func(s string) func(response) bool {
		return func(r response) bool { return strings.Contains(string(r.body), s) }
	}
	R, A := readToken, adminToken

	// OpenAPI and overview.
	ok("openapi", "GET", "/api/v1/openapi.yaml", "", nil, 200, has("openapi: 3"))
	ok("overview", "GET", "/api/v1/overview", R, nil, 200, has(`"jobs_total": 5`))

	// Jobs: submit.
	valid := []byte("name: api\nidempotency_key: api-1\nsteps:\n- {id: a, action: echo}\n")
	ok("submit", "POST", "/api/v1/jobs", A, valid, 201, has(`"confirmed": true`))
	ok("submit again (same key)", "POST", "/api/v1/jobs", A, valid, 200, has(`"existing": true`))
	r := b.call(t, "POST", "/api/v1/jobs", A, []byte("name: x\nsteps:\n- {id: a, action: echo, depends_on: [a]}\n"))
	wantError(t, "submit invalid spec", r, 400, ops.CodeInvalid)
	if !strings.Contains(string(r.body), `"reason": "`+spec.ReasonCycle+`"`) {
		t.Errorf("submit invalid spec: no reason: %s", r.body)
	}
	wantError(t, "submit empty", b.call(t, "POST", "/api/v1/jobs", A, nil), 400, ops.CodeInvalid)

	// Jobs: list.
	var page ops.JobsPage
	r = b.call(t, "GET", "/api/v1/jobs?state=running,failed&limit=2", R, nil)
	r.decode(t, &page)
	if r.status != 200 || page.Matched != 4 || len(page.Jobs) != 2 || page.Next == "" {
		t.Errorf("list: %d %s", r.status, r.body)
	}
	r = b.call(t, "GET", "/api/v1/jobs?state=running,failed&limit=2&cursor="+page.Next, R, nil)
	page = ops.JobsPage{}
	r.decode(t, &page)
	if r.status != 200 || len(page.Jobs) != 2 || page.Next != "" {
		t.Errorf("list page 2: %d %s", r.status, r.body)
	}
	ok("list since", "GET", "/api/v1/jobs?since=1h", R, nil, 200, has(`"matched": 5`))
	for _, q := range []string{"limit=abc", "limit=5000", "state=sleeping", "cursor=!!!", "since=yesterday", "created_after=monday"} {
		wantError(t, "list ?"+q, b.call(t, "GET", "/api/v1/jobs?"+q, R, nil), 400, ops.CodeInvalid)
	}

	// Jobs: show, with the retry chain.
	var d client.JobDetail
	r = b.call(t, "GET", "/api/v1/jobs/job-failed", R, nil)
	r.decode(t, &d)
	if r.status != 200 || len(d.Steps) != 2 || len(d.Steps[1].Attempts) != 2 || d.Steps[1].Attempts[0].Agent != "agent-2" {
		t.Errorf("show: %d %s", r.status, r.body)
	}
	wantError(t, "show missing", b.call(t, "GET", "/api/v1/jobs/job-nope", R, nil), 404, ops.CodeNotFound)
	wantError(t, "show invalid id", b.call(t, "GET", "/api/v1/jobs/bad.id", R, nil), 404, ops.CodeNotFound)

	// Jobs: cancel and retry.
	ok("cancel", "POST", "/api/v1/jobs/job-run/cancel", A, nil, 200, has(`"cancelled": [`))
	wantError(t, "cancel finished", b.call(t, "POST", "/api/v1/jobs/job-ok/cancel", A, nil), 409, ops.CodeConflict)
	wantError(t, "cancel missing", b.call(t, "POST", "/api/v1/jobs/job-nope/cancel", A, nil), 404, ops.CodeNotFound)
	ok("retry", "POST", "/api/v1/jobs/job-failed/retry", A, nil, 200, has(`"reopened": [`))
	wantError(t, "retry running", b.call(t, "POST", "/api/v1/jobs/job-run2/retry", A, nil), 409, ops.CodeConflict)
	wantError(t, "retry missing", b.call(t, "POST", "/api/v1/jobs/job-nope/retry", A, nil), 404, ops.CodeNotFound)

	// Agents.
	ok("agents", "GET", "/api/v1/agents", R, nil, 200, has(`"heartbeat_age_seconds"`))
	ok("agent", "GET", "/api/v1/agents/default/agent-1", R, nil, 200, has(`"level": "healthy"`))
	wantError(t, "agent missing", b.call(t, "GET", "/api/v1/agents/default/nope", R, nil), 404, ops.CodeNotFound)
	ok("agent health", "GET", "/api/v1/agents/default/agent-1/health", R, nil, 200, has(`"score": 0.9`))
	wantError(t, "agent health unassessed", b.call(t, "GET", "/api/v1/agents/default/agent-2/health", R, nil), 404, ops.CodeNotFound)
	wantError(t, "agent health missing", b.call(t, "GET", "/api/v1/agents/default/nope/health", R, nil), 404, ops.CodeNotFound)
	for _, act := range []string{"drain", "undrain"} {
		ok(act, "POST", "/api/v1/agents/default/agent-1/"+act, A, nil, 200, has(act+"ed"))
		wantError(t, act+" missing", b.call(t, "POST", "/api/v1/agents/default/nope/"+act, A, nil), 404, ops.CodeNotFound)
		// An id no agent can have: it went into the subject unchecked, and
		// nats.go's "bad subject" came back as 503.
		wantError(t, act+" invalid id", b.call(t, "POST", "/api/v1/agents/default/a%20b/"+act, A, nil), 404, ops.CodeNotFound)
	}
	wantError(t, "failover without a supervisor", b.call(t, "POST", "/api/v1/agents/default/agent-9/failover", A, nil), 503, ops.CodeUnavailable)
	wantError(t, "failover invalid id", b.call(t, "POST", "/api/v1/agents/default/a%21b/failover", A, nil), 400, ops.CodeInvalid)
	sub, err := b.nc.Subscribe(protocol.SubjectControlFailover, func(m *nats.Msg) {
		_ = m.Respond(protocol.OKReply("failover f2: 0 tasks moved to [], 0 waiting (done) for " + string(m.Data)))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	ok("failover", "POST", "/api/v1/agents/default/agent-9/failover", A, nil, 200, has("default.agent-9"))

	// Queues.
	ok("task queues", "GET", "/api/v1/queues/tasks", R, nil, 200, has(`"stream": "WARDEN_TASKS_1"`))
	ok("dead letters", "GET", "/api/v1/queues/dead-letters", R, nil, 200, has(`"reason": "max_deliveries"`))
	wantError(t, "dead letters ?limit=x", b.call(t, "GET", "/api/v1/queues/dead-letters?limit=x", R, nil), 400, ops.CodeInvalid)
	ok("dead letter", "GET", fmt.Sprintf("/api/v1/queues/dead-letters/%d", letter), R, nil, 200, has(`"job_id": "job-dl"`))
	wantError(t, "dead letter missing", b.call(t, "GET", "/api/v1/queues/dead-letters/999", R, nil), 404, ops.CodeNotFound)
	wantError(t, "dead letter invalid id", b.call(t, "GET", "/api/v1/queues/dead-letters/abc", R, nil), 400, ops.CodeInvalid)
	ok("dead letter retry", "POST", fmt.Sprintf("/api/v1/queues/dead-letters/%d/retry", letter), A, nil, 200, has(`"step_id": "a"`))
	wantError(t, "dead letter retry again", b.call(t, "POST", fmt.Sprintf("/api/v1/queues/dead-letters/%d/retry", letter), A, nil), 404, ops.CodeNotFound)
	wantError(t, "dead letter retry of a step not dead-lettered", b.call(t, "POST", fmt.Sprintf("/api/v1/queues/dead-letters/%d/retry", stale), A, nil), 409, ops.CodeConflict)
	wantError(t, "dead letter retry invalid id", b.call(t, "POST", "/api/v1/queues/dead-letters/0/retry", A, nil), 400, ops.CodeInvalid)
	wantError(t, "purge unconfirmed", b.call(t, "DELETE", "/api/v1/queues/dead-letters", A, nil), 400, ops.CodeInvalid)
	ok("purge", "DELETE", "/api/v1/queues/dead-letters?confirm=yes", A, nil, 200, has(`"purged": 1`))

	// History.
	ok("healing actions", "GET", "/api/v1/healing/actions", R, nil, 200, has(`"deprioritise"`))
	wantError(t, "healing actions ?limit=-1", b.call(t, "GET", "/api/v1/healing/actions?limit=-1", R, nil), 400, ops.CodeInvalid)
	ok("healing status", "GET", "/api/v1/healing/status", R, nil, 200, has(`"healthy": 1`))
	ok("failovers", "GET", "/api/v1/failovers", R, nil, 200, has(`"agent-3"`))
	wantError(t, "failovers ?limit=x", b.call(t, "GET", "/api/v1/failovers?limit=x", R, nil), 400, ops.CodeInvalid)

	// Clusters.
	def := []byte(`{"name": "web", "replication_mode": "active_passive", "membership": {"minimum_agents": 1, "desired_agents": 2}}`)
	ok("cluster create", "POST", "/api/v1/clusters", A, def, 201, has(`"name": "web"`))
	wantError(t, "cluster create again", b.call(t, "POST", "/api/v1/clusters", A, def), 409, ops.CodeConflict)
	wantError(t, "cluster create invalid", b.call(t, "POST", "/api/v1/clusters", A, []byte(`{"name": "x", "replication_mode": "sideways"}`)), 400, ops.CodeInvalid)
	wantError(t, "cluster create malformed", b.call(t, "POST", "/api/v1/clusters", A, []byte(`{"nom": 1}`)), 400, ops.CodeInvalid)
	ok("clusters", "GET", "/api/v1/clusters", R, nil, 200, has(`"web"`))
	ok("cluster", "GET", "/api/v1/clusters/web", R, nil, 200, has(`"definition"`))
	wantError(t, "cluster missing", b.call(t, "GET", "/api/v1/clusters/nope", R, nil), 404, ops.CodeNotFound)
	ok("cluster update", "PUT", "/api/v1/clusters/web", A, def, 200, has(`"web"`))
	wantError(t, "cluster update missing", b.call(t, "PUT", "/api/v1/clusters/nope", A, []byte(`{"name": "nope", "replication_mode": "active_passive"}`)), 404, ops.CodeNotFound)
	ok("cluster rebalance", "POST", "/api/v1/clusters/web/rebalance", A, nil, 202, has(`"request_id"`))
	ok("cluster failover", "POST", "/api/v1/clusters/web/failover", A, []byte(`{"reason": "test"}`), 202, has(`"op": "failover"`))
	wantError(t, "cluster failover missing", b.call(t, "POST", "/api/v1/clusters/nope/failover", A, nil), 404, ops.CodeNotFound)
	ok("cluster delete", "DELETE", "/api/v1/clusters/web", A, nil, 200, nil)
	wantError(t, "cluster delete missing", b.call(t, "DELETE", "/api/v1/clusters/web", A, nil), 404, ops.CodeNotFound)

	// Events: validation here, the stream in TestEventStream.
	wantError(t, "events ?types=bogus", b.call(t, "GET", "/api/v1/events?types=bogus", R, nil), 400, ops.CodeInvalid)
}

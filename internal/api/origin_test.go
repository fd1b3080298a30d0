package api_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/api"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/protocol"
)

// A web page on another site could send a browser's simple request (a POST
// with a text/plain body, no preflight) to a developer's anonymous admin
// API on loopback, which `warden dev` runs: it cancelled the job. Refused
// now; a program's request (no Origin) is not affected.
func TestCrossOriginRequestsAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *api.Config) { c.AnonymousScope = api.ScopeAdmin })
	b.job(t, "j", jobstore.JobRunning, jobstore.StepPending)
	cross := map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"}
	wantError(t, "cross-site cancel", b.send(t, "POST", "/api/v1/jobs/j/cancel", "", cross, nil), http.StatusForbidden, ops.CodeForbidden)
	wantError(t, "cross-site submit", b.send(t, "POST", "/api/v1/jobs", "", cross, []byte("name: x\nsteps: [{id: a, action: echo}]\n")),
		http.StatusForbidden, ops.CodeForbidden)
	if j, _, err := b.store.Job(ctx(t), "j"); err != nil || j.Desired == jobstore.JobCancelled {
		t.Fatalf("job after a refused cross-site cancel: %+v %v", j, err)
	}
	if r := b.send(t, "POST", "/api/v1/jobs/j/cancel", "", nil, nil); r.status != http.StatusOK {
		t.Fatalf("a program's cancel: %d %s", r.status, r.body)
	}
}

// DNS rebinding: a page whose own name resolves to the API's address sends
// its name as Host. Anonymous access is served only under an IP address,
// localhost or anonymous_hosts; a token works under any.
func TestAnonymousAccessOnlyUnderKnownHosts(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *api.Config) { c.AnonymousScope = api.ScopeRead; c.AnonymousHosts = []string{"warden.internal"} })
	for host, want := range map[string]int{
		"evil.example:8080": http.StatusForbidden, "evil.example": http.StatusForbidden,
		"localhost:8080": http.StatusOK, "[::1]:8080": http.StatusOK, "127.0.0.1": http.StatusOK, "warden.internal:80": http.StatusOK,
	} {
		if r := b.send(t, "GET", "/api/v1/overview", host, nil, nil); r.status != want {
			t.Errorf("anonymous GET under Host %s: %d, want %d (%s)", host, r.status, want, r.body)
		}
	}
	if r := b.send(t, "GET", "/api/v1/overview", "evil.example", map[string]string{"Authorization": "Bearer " + readToken}, nil); r.status != http.StatusOK {
		t.Errorf("a token under any Host: %d %s", r.status, r.body)
	}
}

// Shutdown cancelled every request's context at once: a submission the
// server had stored, waiting for the scheduler's confirmation, was
// answered 500, and a client retrying it ran the job twice. Requests now
// finish: 201, unconfirmed.
func TestShutdownAnswersAStoredSubmission(t *testing.T) {
	t.Parallel()
	s, js := newServer(t, api.Config{Listen: "127.0.0.1:0", AnonymousScope: api.ScopeAdmin, RequestTimeout: 20 * time.Second})
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx, func(a string) { addr <- a }) }()
	url := "http://" + <-addr
	// No scheduler runs: the submission is stored and its confirmation
	// never comes; the API waits for it (the client's reply timeout).
	type result struct {
		status int
		body   string
	}
	got := make(chan result, 1)
	go func() {
		res, err := http.Post(url+"/api/v1/jobs", "application/yaml", bytes.NewReader([]byte("name: x\nsteps: [{id: a, action: echo}]\n")))
		if err != nil {
			got <- result{0, err.Error()}
			return
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		got <- result{res.StatusCode, string(b)}
	}()
	natstest.Eventually(t, 10*time.Second, "the submission is stored", func() bool { return pendingSubmissions(t, js) == 1 })
	stop() // SIGTERM
	r := <-got
	if r.status != http.StatusCreated || !regexp.MustCompile(`"confirmed":\s*false`).MatchString(r.body) {
		t.Fatalf("a stored submission during shutdown: %d %s, want 201 unconfirmed", r.status, r.body)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// pendingSubmissions is how many submissions WARDEN_SUBMIT holds.
func pendingSubmissions(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	st, err := js.Stream(ctx(t), protocol.StreamSubmit)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/api"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// submitSpec is a job without an idempotency key: submitting it twice
// makes two jobs.
var submitSpec = []byte("name: x\nsteps: [{id: a, action: echo}]\n")

// Shutdown cut the publish of a submission, not only the wait for the
// scheduler's confirmation. NATS restarting, the submission waited in the
// connection's reconnect buffer when the API began to shut down: the API
// answered 500, the connection came back and stored the job, and a client
// that retried the 500 ran it twice. The answer now is the stored job's.
func TestShutdownAnswersASubmissionStoredAfterItBegan(t *testing.T) {
	t.Parallel()
	a := runDisconnectedSubmit(t, api.Config{RequestTimeout: 20 * time.Second})
	a.nats.Up(t) // back within the shutdown's grace
	r := a.answer(t)
	job := a.storedJob(t)
	var rc struct {
		JobID     string `json:"job_id"`
		Confirmed bool   `json:"confirmed"`
	}
	_ = json.Unmarshal(r.body, &rc)
	if r.status != http.StatusCreated || rc.JobID != job || rc.Confirmed {
		t.Fatalf("a submission stored after shutdown began: %d %s, want 201 unconfirmed for job %s", r.status, r.body, job)
	}
	a.wait(t)
}

// A submission whose publish no server answered before the request's
// deadline, shutdown having cut the wait for its PubAck, may be stored
// later: it is answered 504 timeout, reason outcome_unknown, with the job
// id to look for, not a 500 that a client retries into a second job.
func TestShutdownNamesASubmissionOfUnknownOutcome(t *testing.T) {
	t.Parallel()
	a := runDisconnectedSubmit(t, api.Config{RequestTimeout: 2 * time.Second})
	r := a.answer(t) // NATS still down: nobody can say
	a.wait(t)
	e := wantOutcomeUnknown(t, r)
	a.nats.Up(t)
	if job := a.storedJob(t); e.JobID != job {
		t.Fatalf("answer names job %q; the server stored %s", e.JobID, job)
	}
}

// The same without a shutdown: the request's deadline passes while the
// publish waits for NATS.
func TestSubmissionWithoutPubAckNamesItsJob(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	nc, js := srv.ConnectReconnecting(t, 50*time.Millisecond)
	srv.Ensure(t, js, streams.Options{TaskShards: 1})
	st, err := jobstore.Open(ctx(t), js)
	if err != nil {
		t.Fatal(err)
	}
	s, err := api.New(api.Config{AnonymousScope: api.ScopeAdmin, RequestTimeout: time.Second}, nc, ops.New(nc, st))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	b := bundle{url: hs.URL}
	srv.Down()
	e := wantOutcomeUnknown(t, b.call(t, "POST", "/api/v1/jobs", "", submitSpec))
	srv.Up(t)
	if job := storedSubmission(t, js); e.JobID != job {
		t.Fatalf("answer names job %q; the server stored %s", e.JobID, job)
	}
}

type unknownOutcome struct {
	Code   ops.Code `json:"code"`
	Status int      `json:"status"`
	Reason string   `json:"reason"`
	JobID  string   `json:"job_id"`
}

func wantOutcomeUnknown(t *testing.T, r response) unknownOutcome {
	t.Helper()
	var e struct {
		Error unknownOutcome `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	if r.status != http.StatusGatewayTimeout || e.Error.Code != ops.CodeTimeout || e.Error.Reason != "outcome_unknown" || e.Error.JobID == "" {
		t.Fatalf("a submission of unknown outcome: %d %s, want 504 timeout, reason outcome_unknown, with its job_id", r.status, r.body)
	}
	return e.Error
}

// disconnectedSubmit is an API whose shutdown began while a submission's
// publish waited for NATS, down, in the connection's reconnect buffer.
type disconnectedSubmit struct {
	nats *natstest.Server
	js   jetstream.JetStream
	got  chan response
	done chan error
}

func runDisconnectedSubmit(t *testing.T, cfg api.Config) disconnectedSubmit {
	t.Helper()
	srv := natstest.New(t)
	nc, js := srv.ConnectReconnecting(t, 50*time.Millisecond)
	srv.Ensure(t, js, streams.Options{TaskShards: 1})
	st, err := jobstore.Open(ctx(t), js)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.AnonymousScope = "127.0.0.1:0", api.ScopeAdmin
	s, err := api.New(cfg, nc, ops.New(nc, st))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	addr := make(chan string, 1)
	a := disconnectedSubmit{nats: srv, js: js, got: make(chan response, 1), done: make(chan error, 1)}
	go func() { a.done <- s.Run(runCtx, func(x string) { addr <- x }) }()
	host := <-addr
	url := "http://" + host

	srv.Down()
	natstest.Eventually(t, 10*time.Second, "the connection notices NATS is down", func() bool { return nc.Status() == nats.RECONNECTING })
	go func() {
		res, err := http.Post(url+"/api/v1/jobs", "application/yaml", bytes.NewReader(submitSpec))
		if err != nil {
			a.got <- response{body: []byte(err.Error())}
			return
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		a.got <- response{status: res.StatusCode, body: body}
	}()
	natstest.Eventually(t, 10*time.Second, "the submission waits in the reconnect buffer", func() bool {
		n, err := nc.Buffered()
		return err == nil && n > len(submitSpec)
	})
	stop() // SIGTERM
	natstest.Eventually(t, 10*time.Second, "the API stops listening (its shutdown began)", func() bool {
		c, err := net.DialTimeout("tcp", host, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	})
	return a
}

func (a disconnectedSubmit) answer(t *testing.T) response {
	t.Helper()
	select {
	case r := <-a.got:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no answer to the submission in 30s")
		return response{}
	}
}

func (a disconnectedSubmit) wait(t *testing.T) {
	t.Helper()
	select {
	case err := <-a.done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return in 30s")
	}
}

// storedJob waits for the one submission WARDEN_SUBMIT stores and returns
// the job it names.
func (a disconnectedSubmit) storedJob(t *testing.T) string {
	t.Helper()
	return storedSubmission(t, a.js)
}

func storedSubmission(t *testing.T, js jetstream.JetStream) string {
	t.Helper()
	natstest.Eventually(t, 20*time.Second, "the submission is stored", func() bool {
		c, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		st, err := js.Stream(c, protocol.StreamSubmit)
		if err != nil {
			return false
		}
		info, err := st.Info(c)
		return err == nil && info.State.Msgs == 1
	})
	st, err := js.Stream(ctx(t), protocol.StreamSubmit)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx(t), protocol.SubjectSubmit+".>")
	if err != nil {
		t.Fatal(err)
	}
	return m.Header.Get(protocol.HeaderJobID)
}

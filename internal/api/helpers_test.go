package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/api"
	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

const (
	readToken  = "read-token-0123456789"
	adminToken = "admin-token-0123456789"
)

type bundle struct {
	url   string
	nc    *nats.Conn
	js    jetstream.JetStream
	store *jobstore.Store
	ops   *ops.Ops
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// newServer starts NATS with Warden's streams and builds an API server
// on it with cfg (not serving yet), for tests that run it themselves.
func newServer(t *testing.T, cfg api.Config) (*api.Server, jetstream.JetStream) {
	t.Helper()
	srv := natstest.New(t)
	nc, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{TaskShards: 1})
	st, err := jobstore.Open(ctx(t), js)
	if err != nil {
		t.Fatal(err)
	}
	s, err := api.New(cfg, nc, ops.New(nc, st))
	if err != nil {
		t.Fatal(err)
	}
	return s, js
}

// setup starts NATS with Warden's streams and an API server on it.
func setup(t *testing.T, edit func(*api.Config)) bundle {
	t.Helper()
	srv := natstest.New(t)
	nc, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{TaskShards: 2})
	st, err := jobstore.Open(ctx(t), js)
	if err != nil {
		t.Fatal(err)
	}
	o := ops.New(nc, st)
	cfg := api.Config{MaxBodyBytes: 4096, Tokens: []api.Token{
		{Name: "reader", Scope: api.ScopeRead, Token: readToken},
		{Name: "admin", Scope: api.ScopeAdmin, Token: adminToken},
	}}
	if edit != nil {
		edit(&cfg)
	}
	s, err := api.New(cfg, nc, o)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return bundle{url: hs.URL, nc: nc, js: js, store: st, ops: o}
}

type response struct {
	status int
	body   []byte
	header http.Header
}

func (r response) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

func (b bundle) call(t *testing.T, method, path, token string, body []byte) response {
	t.Helper()
	var h map[string]string
	if token != "" {
		h = map[string]string{"Authorization": "Bearer " + token}
	}
	return b.send(t, method, path, "", h, body)
}

// send is call with headers of its own, and a Host when host is set.
func (b bundle) send(t *testing.T, method, path, host string, header map[string]string, body []byte) response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx(t), method, b.url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if host != "" {
		req.Host = host
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(res.Body)
	return response{res.StatusCode, out, res.Header}
}

// job writes a job and its steps as the scheduler would, each step ending
// in the given state (pending steps stay pending), and the job in state.
func (b bundle) job(t *testing.T, id string, state jobstore.JobState, steps ...jobstore.StepState) {
	t.Helper()
	c := ctx(t)
	sp := spec.Job{Name: "job " + id}
	for i := range steps {
		s := spec.Step{ID: string(rune('a' + i)), Action: "echo"}
		if i > 0 {
			s.DependsOn = []string{string(rune('a' + i - 1))}
		}
		sp.Steps = append(sp.Steps, s)
	}
	now := time.Now().UTC()
	recs, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range recs {
		st.State = steps[i]
		if steps[i] != jobstore.StepPending {
			st.Epoch, st.Attempt, st.Actor = 2, 2, "agent-1"
			st.Attempts = []jobstore.Attempt{
				{Epoch: 1, Agent: "agent-2", Status: "failed", Error: "exit status 1", Class: "retriable", StartedAt: now, FinishedAt: now},
				{Epoch: 2, Agent: "agent-1", Status: string(steps[i]), StartedAt: now, FinishedAt: now},
			}
		}
		if _, err := b.store.CreateStep(c, st); err != nil {
			t.Fatal(err)
		}
	}
	j := jobstore.NewJob(id, sp, now)
	j.State = state
	if state.Terminal() {
		j.FinishedAt = now
	}
	if _, err := b.store.CreateJob(c, j); err != nil {
		t.Fatal(err)
	}
}

// deadLetter stores a dead letter for a step and returns its id.
func (b bundle) deadLetter(t *testing.T, job, step string) uint64 {
	t.Helper()
	m := nats.NewMsg(protocol.SubjectDLQPrefix + ".default.agent-1")
	m.Header.Set(protocol.HeaderJob, job)
	m.Header.Set(protocol.HeaderStep, step)
	m.Header.Set(protocol.HeaderEpoch, "2")
	m.Header.Set(protocol.HeaderDLQReason, "max_deliveries")
	m.Header.Set(protocol.HeaderDLQDetail, "delivered 5 times")
	m.Data = []byte(`{"job_id":"` + job + `"}`)
	ack, err := b.js.PublishMsg(ctx(t), m)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// agent keeps an agent present (heartbeats) and answers its control
// subject, until the test ends.
func (b bundle) agent(t *testing.T, pool, id string) {
	t.Helper()
	kv, err := b.js.KeyValue(ctx(t), protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := b.nc.Subscribe(protocol.AgentControlSubject(pool, id), func(m *nats.Msg) { _ = m.Respond(protocol.OKReply("")) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	put := func() {
		p := protocol.Presence{ID: id, Pool: pool, MaxConcurrent: 4, InFlight: 1, HeartbeatAt: time.Now().UTC(), StartedAt: time.Now().UTC()}.Routed(4)
		v, _ := json.Marshal(p)
		_, _ = kv.Put(context.Background(), protocol.PresenceKey(pool, id), v)
	}
	put()
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		tk := time.NewTicker(500 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
				put()
			}
		}
	}()
	hk, err := b.js.KeyValue(ctx(t), protocol.BucketHealth)
	if err != nil {
		t.Fatal(err)
	}
	rec := health.Record{Agent: id, Pool: pool, Assessment: health.Assessment{Score: 0.9, Level: health.Healthy, AssessedAt: time.Now().UTC()}}
	v, _ := json.Marshal(rec)
	if _, err := hk.Put(ctx(t), protocol.PresenceKey(pool, id), v); err != nil {
		t.Fatal(err)
	}
}

// event stores an audit event.
func (b bundle) event(t *testing.T, e protocol.Event) {
	t.Helper()
	v, _ := json.Marshal(e)
	if _, err := b.js.Publish(ctx(t), protocol.EventSubject(e.Kind, e.ID), v); err != nil {
		t.Fatal(err)
	}
}

// confirmSubmissions plays the scheduler's reply to submissions so that
// a submit returns at once.
func (b bundle) confirmSubmissions(t *testing.T) {
	t.Helper()
	sub, err := b.nc.Subscribe(protocol.SubjectSubmit+".>", func(m *nats.Msg) {
		to := m.Header.Get(protocol.HeaderReplyTo)
		if to == "" {
			return
		}
		id := m.Subject[len(protocol.SubjectSubmit)+1:]
		v, _ := json.Marshal(protocol.SubmitReply{JobID: id})
		_ = b.nc.Publish(to, v)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// Package e2e runs Warden's real binaries against a test NATS server.
package e2e

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
	"github.com/wardenhq/warden/test/procs"
)

var bins map[string]string

func TestMain(m *testing.M) {
	procs.Main(m, &bins, "scheduler", "supervisor", "agent", "warden", "./test/testagent")
}

type env struct {
	srv   *natstest.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	store *jobstore.Store
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv, nc, js := natstest.Start(t, streams.Options{})
	store, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	return &env{srv: srv, nc: nc, js: js, store: store}
}

func (e *env) agent(t *testing.T, id, caps string) *procs.Proc {
	t.Helper()
	args := []string{"--server", e.srv.URL, "--id", id, "--pool", "default"}
	if caps != "" {
		args = append(args, "--capabilities", caps)
	}
	return procs.Start(t, id, bins["agent"], args...)
}

func (e *env) presence(t *testing.T, id string) (protocol.Presence, bool) {
	t.Helper()
	kv, err := e.js.KeyValue(context.Background(), protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := kv.Get(context.Background(), protocol.PresenceKey("default", id))
	if err != nil {
		return protocol.Presence{}, false
	}
	var p protocol.Presence
	return p, json.Unmarshal(entry.Value(), &p) == nil
}

func (e *env) submit(t *testing.T, jobID, body string) {
	t.Helper()
	msg := nats.NewMsg(protocol.SubjectSubmit)
	msg.Data = []byte(body)
	msg.Header.Set(protocol.HeaderJobID, jobID)
	if _, err := e.js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
}

func TestDiamondAcrossRealProcesses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	procs.Start(t, "scheduler", bins["scheduler"], "--server", e.srv.URL)
	caps := map[string][]string{"agent-1": {"linux", "docker"}, "agent-2": {"linux"}, "agent-3": {"linux", "gpu"}}
	for id, c := range caps {
		e.agent(t, id, c[0]+","+c[len(c)-1])
	}
	for id := range caps {
		natstest.Eventually(t, 10*time.Second, id+" present", func() bool { _, ok := e.presence(t, id); return ok })
	}
	e.submit(t, "job-e2e-diamond", `
name: e2e diamond
steps:
  - {id: fetch, action: echo, params: {artifact: app-1.2.3}}
  - {id: build, action: echo, depends_on: [fetch], requires: [docker]}
  - {id: train, action: sleep, params: {duration: 100ms}, depends_on: [fetch], requires: [gpu]}
  - {id: release, action: echo, depends_on: [build, train], requires: [linux]}
`)
	var job *jobstore.Job
	natstest.Eventually(t, 30*time.Second, "job succeeds", func() bool {
		j, _, err := e.store.Job(context.Background(), "job-e2e-diamond")
		job = j
		return err == nil && j.State.Terminal()
	})
	if job.State != jobstore.JobSucceeded {
		t.Fatalf("job %s: %s", job.State, job.Error)
	}
	steps, err := e.store.Steps(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if s.State != jobstore.StepSucceeded || s.Epoch != 1 {
			t.Errorf("step %s: %s at epoch %d", s.ID, s.State, s.Epoch)
		}
		for _, need := range s.Requires {
			if !slices.Contains(caps[s.Actor], need) {
				t.Errorf("step %s ran on %s, which lacks capability %s", s.ID, s.Actor, need)
			}
		}
	}
	byID := map[string]*jobstore.Step{}
	for _, s := range steps {
		byID[s.ID] = s.Step
	}
	if byID["build"].Actor != "agent-1" || byID["train"].Actor != "agent-3" {
		t.Errorf("build ran on %s, train on %s", byID["build"].Actor, byID["train"].Actor)
	}
	if byID["release"].Attempts[0].StartedAt.Before(byID["train"].FinishedAt) {
		t.Errorf("release dispatched before train finished")
	}
}

func TestSecondAgentWithTakenIDExitsNonZero(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	first := e.agent(t, "twin", "")
	natstest.Eventually(t, 10*time.Second, "first agent present", func() bool { _, ok := e.presence(t, "twin"); return ok })
	second := e.agent(t, "twin", "")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	code, err := second.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if code == 0 {
		t.Fatalf("second agent exited 0:\n%s", second.Output())
	}
	if out := second.Output(); !strings.Contains(out, strconv.Itoa(first.PID())) {
		t.Errorf("exit message does not name the other agent (pid %d):\n%s", first.PID(), out)
	}
	if !first.Running() {
		t.Errorf("first agent stopped:\n%s", first.Output())
	}
}

package ops_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// The read endpoints are what the readonly identity may call (and what the
// HTTP API's read scope serves): none of them answers with a step's lease
// token, which would let its reader take the result's dedup id first. A
// one-step job keeps its step inline, in the job record; a dead letter is
// a copy of its task, Warden-Token header and body included.
func TestReadEndpointsHideTheLeaseToken(t *testing.T) {
	t.Parallel()
	nc, st, _ := apiMicro(t)
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now().UTC()
	var tokens []string
	for _, id := range []string{"job-steps", "job-inline"} {
		sp := spec.Job{Name: id, Steps: []spec.Step{{ID: "a", Action: "echo"}}}
		if id == "job-steps" {
			sp.Steps = append(sp.Steps, spec.Step{ID: "b", Action: "echo", DependsOn: []string{"a"}})
		}
		steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, protocol.NewLeaseToken())
		if err := steps[0].Dispatch("agent-1", tokens[len(tokens)-1], now, time.Second); err != nil {
			t.Fatal(err)
		}
		j := jobstore.NewJob(id, sp, now)
		j.State = jobstore.JobRunning
		if id == "job-inline" {
			j.Inline, j.Steps = true, steps
		} else {
			for _, s := range steps {
				if _, err := st.CreateStep(c, s); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := st.CreateJob(c, j); err != nil {
			t.Fatal(err)
		}
	}
	m := nats.NewMsg(protocol.DLQSubject("default", "agent-1"))
	m.Data, _ = json.Marshal(protocol.Task{JobID: "job-steps", StepID: "a", Epoch: 1, Attempt: 1, Action: "echo", Token: tokens[0]})
	m.Header.Set(protocol.HeaderJob, "job-steps")
	m.Header.Set(protocol.HeaderStep, "a")
	m.Header.Set(protocol.HeaderEpoch, "1")
	m.Header.Set(protocol.HeaderToken, tokens[0])
	m.Header.Set(protocol.HeaderDLQReason, string(protocol.DLQMaxDeliveries))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.PublishMsg(c, m) // as an agent stores it
	if err != nil {
		t.Fatal(err)
	}
	letter := ack.Sequence

	for _, req := range []struct{ subject, body string }{
		{"warden.ops.api.jobs.show", `{"id": "job-steps"}`},
		{"warden.ops.api.jobs.show", `{"id": "job-inline"}`},
		{"warden.ops.api.jobs.list", `{}`},
		{"warden.ops.api.dlq.list", `{}`},
		{"warden.ops.api.dlq.show", fmt.Sprintf(`{"id": "%d"}`, letter)},
	} {
		r, err := nc.Request(req.subject, []byte(req.body), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if code := r.Header.Get(micro.ErrorCodeHeader); code != "" {
			t.Fatalf("%s %s: error %s %s", req.subject, req.body, code, r.Data)
		}
		body := string(r.Data)
		for _, tok := range tokens {
			if i := strings.Index(body, tok); i >= 0 {
				t.Errorf("%s %s answers a lease token: ...%s...", req.subject, req.body, body[max(i-60, 0):min(i+40, len(body))])
			}
		}
		if strings.Contains(body, `"token"`) || strings.Contains(body, protocol.HeaderToken) {
			t.Errorf("%s %s answers a token member or header: %s", req.subject, req.body, body)
		}
	}
}

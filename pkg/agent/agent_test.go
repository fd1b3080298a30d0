package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

func TestEchoRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t, testConfig("a1"), nil)
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Epoch: 7, Action: "echo", Params: json.RawMessage(`{"hello":"world"}`)})
	r, msg := b.result(t, "j1", "s1")
	if r.Status != protocol.ResultSucceeded || string(r.Output) != `{"hello":"world"}` || r.Epoch != 7 || r.Agent != "a1" {
		t.Fatalf("result: %+v", r)
	}
	h := msg.Headers()
	if h.Get(protocol.HeaderJob) != "j1" || h.Get(protocol.HeaderStep) != "s1" || h.Get(protocol.HeaderEpoch) != "7" ||
		h.Get(protocol.HeaderAgent) != "a1" || h.Get(protocol.HeaderMsgID) != protocol.ResultMsgID("j1", "s1", 7, "") {
		t.Fatalf("result headers: %v", h)
	}
	if r.StartedAt.IsZero() || r.FinishedAt.Before(r.StartedAt) {
		t.Fatalf("result times: %+v", r)
	}
	natstest.Eventually(t, 5*time.Second, "task acked (removed from the work queue)", func() bool { return b.taskMessages(t) == 0 })
	natstest.Eventually(t, 5*time.Second, "heartbeat counts the success", func() bool {
		p, err := b.presence(t)
		return err == nil && p.Succeeded == 1 && p.InFlight == 0
	})
	rec := httptest.NewRecorder()
	b.agent.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), `warden_agent_results_succeeded_total{agent="a1",pool="p"} 1`) {
		t.Fatalf("metrics:\n%s", rec.Body)
	}
	p, _ := b.presence(t)
	if p.TaskSubject != b.agent.TaskSubject() || p.MaxConcurrent != agent.DefaultMaxConcurrent ||
		strings.Join(p.Actions, ",") != "echo,sleep" || p.Draining || p.PID == 0 || p.Host == "" {
		t.Fatalf("presence: %+v", p)
	}
}

func TestShellAllowList(t *testing.T) {
	t.Parallel()
	cfg := testConfig("a1")
	cfg.Actions = []string{"shell"}
	cfg.Shell.AllowedCommands = []string{"echo"}
	b := setup(t, cfg, nil)

	b.publish(t, protocol.Task{JobID: "j1", StepID: "ok", Action: "shell", Params: json.RawMessage(`{"command":"echo","args":["hi"]}`)})
	r, _ := b.result(t, "j1", "ok")
	if r.Status != protocol.ResultSucceeded || !strings.Contains(string(r.Output), `"stdout_tail":"hi\n"`) {
		t.Fatalf("allowed command: %+v (output %s)", r, r.Output)
	}

	b.publish(t, protocol.Task{JobID: "j1", StepID: "denied", Action: "shell", Params: json.RawMessage(`{"command":"ls"}`)})
	r, _ = b.result(t, "j1", "denied")
	if r.Status != protocol.ResultFailed || r.ErrorClass != protocol.ClassPermanent || !strings.Contains(r.Error, "not in shell.allowed_commands") {
		t.Fatalf("denied command: %+v", r)
	}

	// echo is a built-in, but not in this agent's allow-list.
	b.publish(t, protocol.Task{JobID: "j1", StepID: "echo", Action: "echo"})
	r, _ = b.result(t, "j1", "echo")
	if r.ErrorClass != protocol.ClassPermanent || r.Error != `unknown action "echo" (this agent allows: shell)` {
		t.Fatalf("built-in outside the allow-list: %+v", r)
	}
}

func TestUnknownAndNotAllowedActions(t *testing.T) {
	t.Parallel()
	var ran atomic.Bool
	cfg := testConfig("a1")
	cfg.Actions = []string{"echo"}
	b := setup(t, cfg, func(a *agent.Agent) {
		a.Handle("secret", func(context.Context, *agent.Task) (any, error) { ran.Store(true); return nil, nil })
	})
	for _, action := range []string{"nope", "secret"} {
		b.publish(t, protocol.Task{JobID: "j1", StepID: action, Action: action})
		r, _ := b.result(t, "j1", action)
		if r.Status != protocol.ResultFailed || r.ErrorClass != protocol.ClassPermanent ||
			r.Error != `unknown action "`+action+`" (this agent allows: echo)` {
			t.Fatalf("%s: %+v", action, r)
		}
	}
	if ran.Load() {
		t.Fatal("a handler outside the allow-list ran")
	}
}

func TestHandlerErrorClasses(t *testing.T) {
	t.Parallel()
	b := setup(t, testConfig("a1"), func(a *agent.Agent) {
		a.Handle("perm", func(context.Context, *agent.Task) (any, error) {
			return nil, agent.Permanent(errors.New("bad input"))
		})
		a.Handle("later", func(context.Context, *agent.Task) (any, error) {
			return nil, agent.RetryAfter(5*time.Second, errors.New("busy"))
		})
		a.Handle("retry", func(context.Context, *agent.Task) (any, error) {
			return nil, agent.Retriable(errors.New("flaky"))
		})
		a.Handle("plain", func(context.Context, *agent.Task) (any, error) {
			return map[string]int{"partial": 1}, errors.New("plain failure")
		})
		a.Handle("panic", func(context.Context, *agent.Task) (any, error) { panic("kaboom") })
		// Panics in the handler's own code that reading its results runs:
		// they took the whole agent down.
		a.Handle("typednil", func(context.Context, *agent.Task) (any, error) {
			var e *codedError
			return nil, e
		})
		a.Handle("badjson", func(context.Context, *agent.Task) (any, error) { return panickyOutput{}, nil })
		a.Handle("goexit", func(context.Context, *agent.Task) (any, error) { runtime.Goexit(); return nil, nil })
		a.Handle("bind", func(_ context.Context, t *agent.Task) (any, error) {
			var p struct {
				Size int `json:"size"`
			}
			return nil, t.Bind(&p)
		})
	})
	tests := []struct {
		action, params, err, class string
		after                      time.Duration
		output                     string
	}{
		{action: "perm", err: "bad input", class: protocol.ClassPermanent},
		{action: "later", err: "busy", class: protocol.ClassRetriable, after: 5 * time.Second},
		{action: "retry", err: "flaky", class: protocol.ClassRetriable},
		{action: "plain", err: "plain failure", output: `{"partial":1}`},
		{action: "panic", err: "handler panicked: kaboom"},
		{action: "typednil", err: "handler panicked: runtime error: invalid memory address or nil pointer dereference"},
		{action: "badjson", err: "handler panicked: kaboom in MarshalJSON"},
		{action: "goexit", err: "handler called runtime.Goexit (t.FailNow?) instead of returning", class: protocol.ClassPermanent},
		{action: "bind", params: `{"sise":1}`, err: `invalid params: unknown field "sise"`, class: protocol.ClassPermanent},
	}
	for _, tt := range tests {
		b.publish(t, protocol.Task{JobID: "j1", StepID: tt.action, Action: tt.action, Params: json.RawMessage(tt.params)})
	}
	for _, tt := range tests {
		r, _ := b.result(t, "j1", tt.action)
		if r.Status != protocol.ResultFailed || r.Error != tt.err || r.ErrorClass != tt.class ||
			r.RetryAfter.Std() != tt.after || string(r.Output) != tt.output {
			t.Errorf("%s: got %+v (output %s)", tt.action, r, r.Output)
		}
	}
	natstest.Eventually(t, 5*time.Second, "failures counted", func() bool { return b.agent.Stats().Failed == uint64(len(tests)) })
}

func TestGarbageTaskTerminated(t *testing.T) {
	t.Parallel()
	b := setup(t, testConfig("a1"), nil)
	if _, err := b.js.Publish(context.Background(), b.agent.TaskSubject(), []byte("not json")); err != nil {
		t.Fatal(err)
	}
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Action: "echo"})
	if r, _ := b.result(t, "j1", "s1"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("agent broken by garbage: %+v", r)
	}
	natstest.Eventually(t, 5*time.Second, "garbage terminated", func() bool {
		return b.agent.Stats().Rejected == 1 && b.taskMessages(t) == 0
	})
	dl, err := b.deadLetter(t)
	if err != nil || string(dl.Data) != "not json" || dl.Header.Get(protocol.HeaderDLQReason) != "undecodable" ||
		dl.Header.Get(protocol.HeaderDLQDeliveries) != "1" || dl.Header.Get(protocol.HeaderDLQStreamSeq) != "1" {
		t.Fatalf("dead letter: %+v, %v", dl, err)
	}
}

func TestExpiredTaskNotRun(t *testing.T) {
	t.Parallel()
	var ran atomic.Bool
	b := setup(t, testConfig("a1"), func(a *agent.Agent) {
		a.Handle("work", func(context.Context, *agent.Task) (any, error) { ran.Store(true); return nil, nil })
	})
	b.publish(t, protocol.Task{JobID: "j1", StepID: "s1", Action: "work", Deadline: time.Now().Add(-time.Second)})
	natstest.Eventually(t, 5*time.Second, "expired task terminated", func() bool {
		return b.agent.Stats().Expired == 1 && b.taskMessages(t) == 0
	})
	b.noResult(t, "j1", "s1")
	dl, err := b.deadLetter(t)
	if err != nil || dl.Header.Get(protocol.HeaderDLQReason) != "expired" || dl.Header.Get(protocol.HeaderJob) != "j1" ||
		dl.Header.Get(protocol.HeaderMsgID) != "dlq.j1.s1.1.expired" {
		t.Fatalf("dead letter: %+v, %v", dl, err)
	}
	if ran.Load() {
		t.Fatal("a task past its deadline ran")
	}
}

func TestStreamsMissing(t *testing.T) {
	t.Parallel()
	s := natstest.New(t)
	nc, _ := s.Connect(t)
	a, err := agent.New(testConfig("a1"), agent.WithConn(nc), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	err = a.Run(t.Context())
	if !errors.Is(err, agent.ErrStreamsMissing) || !strings.Contains(err.Error(), "warden dev") {
		t.Fatalf("want ErrStreamsMissing naming `warden dev`, got %v", err)
	}
}

// An agent configured with other task_shards than the deployment's is
// refused at start with both values named: it would wait on a shard no
// scheduler publishes its tasks to.
func TestTaskShardsMismatchRefused(t *testing.T) {
	t.Parallel()
	_, nc, _ := natstest.Start(t, streams.Options{TaskShards: testShards})
	cfg := testConfig("a1")
	cfg.TaskShards = testShards + 1
	a, err := agent.New(cfg, agent.WithConn(nc), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	err = a.Run(t.Context())
	var mm *streams.MismatchError
	if !errors.As(err, &mm) || mm.Setting != "task_shards" || mm.Configured != testShards+1 || mm.Recorded != testShards {
		t.Fatalf("want a task_shards mismatch %d vs %d, got %v", testShards+1, testShards, err)
	}
}

func TestConsumerConfig(t *testing.T) {
	t.Parallel()
	cfg := testConfig("a1")
	cfg.Lease = protocol.Duration(7 * time.Second)
	cfg.MaxConcurrent = 3
	cfg.MaxDeliver = 9
	b := setup(t, cfg, nil)
	c := b.consumerInfo(t).Config
	if c.AckWait != 7*time.Second || c.MaxAckPending != 3 || c.MaxDeliver != 9 || c.FilterSubject != b.agent.TaskSubject() || c.Durable != "a1" {
		t.Fatalf("consumer config: %+v", c)
	}
	if !strings.HasPrefix(b.agent.TaskSubject(), "warden.task.") {
		t.Fatalf("task subject %s", b.agent.TaskSubject())
	}
}

// codedError is an error type whose Error dereferences its receiver: a
// typed nil one panics when read.
type codedError struct{ code int }

func (e *codedError) Error() string { return fmt.Sprintf("code %d", e.code) }

// panickyOutput is an output whose encoding panics.
type panickyOutput struct{}

func (panickyOutput) MarshalJSON() ([]byte, error) { panic("kaboom in MarshalJSON") }

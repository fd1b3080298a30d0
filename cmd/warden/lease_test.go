package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// `job show` and `dlq show`/`ls` never print a step's lease token, --json
// or not: it is half of the result's dedup id, and output gets pasted into
// tickets and chats. The job's own step and the letter are otherwise shown
// as before.
func TestShowCommandsHideTheLeaseToken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	now := time.Now().UTC()
	sp := spec.Job{Name: "leased", Steps: []spec.Step{{ID: "a", Action: "echo"}, {ID: "b", Action: "echo", DependsOn: []string{"a"}}}}
	steps, err := jobstore.NewSteps("job-l", sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	token := protocol.NewLeaseToken()
	if err := steps[0].Dispatch("agent-1", token, now, time.Second); err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if _, err := e.store.CreateStep(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	j := jobstore.NewJob("job-l", sp, now)
	j.State = jobstore.JobRunning
	if _, err := e.store.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(protocol.DLQSubject("default", "agent-1"))
	m.Data, _ = json.Marshal(protocol.Task{JobID: "job-l", StepID: "a", Epoch: 1, Attempt: 1, Action: "echo", Token: token})
	m.Header.Set(protocol.HeaderJob, "job-l")
	m.Header.Set(protocol.HeaderStep, "a")
	m.Header.Set(protocol.HeaderEpoch, "1")
	m.Header.Set(protocol.HeaderToken, token)
	m.Header.Set(protocol.HeaderDLQReason, string(protocol.DLQMaxDeliveries))
	ack, err := e.js.PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	letter := strconv.FormatUint(ack.Sequence, 10)

	for _, args := range [][]string{
		{"job", "show", "job-l", "--json"},
		{"job", "show", "job-l"},
		{"dlq", "show", letter, "--json"},
		{"dlq", "show", letter},
		{"dlq", "ls", "--json"},
	} {
		r := warden(t, "", append(args, "--server", e.url)...)
		if r.code != exitOK {
			t.Fatalf("warden %v: exit %d: %s", args, r.code, r.stderr)
		}
		out := r.stdout + r.stderr
		if i := strings.Index(out, token); i >= 0 {
			t.Errorf("warden %v prints the lease token: ...%s...", args, out[max(i-60, 0):min(i+40, len(out))])
		}
		if strings.Contains(out, `"token"`) || strings.Contains(out, protocol.HeaderToken) {
			t.Errorf("warden %v prints a token member or the %s header:\n%s", args, protocol.HeaderToken, out)
		}
	}

	// The step still shows its lease.
	r := warden(t, "", "job", "show", "job-l", "--json", "--server", e.url)
	var d client.JobDetail
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || len(d.Steps) != 2 {
		t.Fatalf("job show --json: %v %s", err, r.stdout)
	}
	if a := d.Steps[0]; a.State != jobstore.StepDispatched || a.Actor != "agent-1" || a.LockedUntil.IsZero() || a.Epoch != 1 || a.Token != "" {
		t.Fatalf("job show --json: step a %+v", a)
	}
	r = warden(t, "", "dlq", "show", letter, "--server", e.url)
	for _, want := range []string{"job-l.a (epoch 1)", protocol.HeaderJob, `"action":"echo"`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dlq show lacks %q:\n%s", want, r.stdout)
		}
	}
}

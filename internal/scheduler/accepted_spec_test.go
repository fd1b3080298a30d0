package scheduler_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/handagent"
)

// A delayed submission released (or a schedule's tick) was accepted
// before, maybe by a version without today's input checks (each key once
// and in lower case, nothing after the JSON object, durations of at least
// 1 ms): it is not held to them, or an upgrade would reject at its start
// a job it had accepted. A new submission is. (A review of those checks.)
//
// Without spec.Limits.Accepted: "timed out after 20s: job job-released
// succeeded" (it was rejected: a key twice, data after the object).
func TestReleasedSubmissionIsNotHeldToNewInputChecks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	handagent.Start(t, b.js, "default", "a1", nil)
	body := []byte(`{"name":"old","steps":[{"id":"a","action":"echo","params":{"x":1,"x":2}}]}}`)
	msg := nats.NewMsg(protocol.SubmitSubject("job-released"))
	msg.Data = body
	msg.Header.Set(protocol.HeaderReleased, time.Now().UTC().Format(time.RFC3339Nano))
	if _, err := b.js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	b.waitJob(t, "job-released", jobstore.JobSucceeded)

	fresh := b.submit(t, []byte(`{"name":"new","steps":[{"id":"a","action":"echo","timeout":5000}]}`), "job-fresh", "")
	if fresh.Error == "" {
		t.Fatalf("a new submission with a 5µs timeout was accepted: %+v", fresh)
	}
}

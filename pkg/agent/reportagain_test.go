package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
)

// countHandler counts its runs; each run's output names its number.
func countHandler(runs *atomic.Int32) func(*agent.Agent) {
	return func(a *agent.Agent) {
		a.Handle("count", func(context.Context, *agent.Task) (any, error) {
			return map[string]int32{"run": runs.Add(1)}, nil
		})
	}
}

// republishAs publishes task again as a message the task stream does not
// deduplicate (msgID): what the agent gets when a dispatch is published
// again past the stream's duplicate window, or its ack was lost.
func (b *bundle) republishAs(t *testing.T, task protocol.Task, msgID string) {
	t.Helper()
	m := b.taskMsg(t, task)
	m.Header.Set(protocol.HeaderMsgID, msgID)
	if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// A dispatch that comes again (the scheduler or the supervisor published it
// again) after this agent stored its result is not run again: the stored
// result is published again, byte for byte under its own Nats-Msg-Id, and
// the task acked. Another attempt or another epoch of the step runs.
func TestTaskAgainReportsStoredResultUnrun(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	b := setup(t, testConfig("a1"), countHandler(&runs))
	task := protocol.Task{JobID: "again", StepID: "s", Action: "count", Token: "tok-1"}
	b.publish(t, task)
	first, stored := b.result(t, task.JobID, task.StepID)
	if first.Status != protocol.ResultSucceeded {
		t.Fatalf("first result %+v, want succeeded", first)
	}
	natstest.Eventually(t, 10*time.Second, "first delivery acked", func() bool { return b.taskMessages(t) == 0 })

	// Core NATS sees a copy the results stream drops as a duplicate.
	sub, err := b.nc.SubscribeSync(protocol.ResultSubject("p", "a1", task.JobID, task.StepID))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	b.republishAs(t, task, "again-1")
	copyMsg, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("the stored result was not published again: %v", err)
	}
	if !bytes.Equal(copyMsg.Data, stored.Data()) ||
		copyMsg.Header.Get(protocol.HeaderMsgID) != stored.Headers().Get(protocol.HeaderMsgID) {
		t.Fatalf("published again %s (%s), want the stored %s (%s)", copyMsg.Data, copyMsg.Header.Get(protocol.HeaderMsgID),
			stored.Data(), stored.Headers().Get(protocol.HeaderMsgID))
	}
	natstest.Eventually(t, 10*time.Second, "second delivery acked", func() bool {
		return b.taskMessages(t) == 0 && b.consumerInfo(t).NumAckPending == 0
	})
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times for one attempt, want once", n)
	}
	if st := b.agent.Stats(); st.ReportedAgain != 1 || st.Succeeded != 1 {
		t.Fatalf("stats %+v, want one result and one reported again", st)
	}

	// Not the same task: another attempt of the epoch, another epoch.
	for i, other := range []protocol.Task{
		{JobID: "again", StepID: "s", Action: "count", Token: "tok-1", Attempt: 2},
		{JobID: "again", StepID: "s", Action: "count", Token: "tok-2", Epoch: 2, Attempt: 2},
	} {
		b.republishAs(t, other, fmt.Sprintf("other-%d", i))
		want := int32(i + 2)
		natstest.Eventually(t, 10*time.Second, fmt.Sprintf("task %+v run", other), func() bool { return runs.Load() == want })
	}
}

// A retry's task (attempt 2) that arrives after the step's expires_at is not
// run, and its report does not hide the step's real error behind
// "expired": the failure this agent reported for attempt 1 is repeated,
// worded as the scheduler words a retry its expiry stopped. Without that
// failure at hand, the report still says that a retry expired.
func TestExpiredRetryKeepsTheStepsError(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	b := setup(t, testConfig("a1"), func(a *agent.Agent) {
		a.Handle("flaky", func(context.Context, *agent.Task) (any, error) {
			runs.Add(1)
			return nil, agent.Retriable(errors.New("disk full on /var"))
		})
	})
	first := protocol.Task{JobID: "retried", StepID: "s", Action: "flaky", Token: "tok-1"}
	b.publish(t, first)
	if r := resultOfEpoch(t, b, first.JobID, first.StepID, 1); r.Error != "disk full on /var" {
		t.Fatalf("attempt 1 reported %+v", r)
	}

	expires := time.Now().Add(-time.Minute).Truncate(time.Second).UTC()
	retry := protocol.Task{JobID: "retried", StepID: "s", Action: "flaky", Token: "tok-2", Epoch: 2, Attempt: 2, ExpiresAt: expires}
	b.publish(t, retry)
	r := resultOfEpoch(t, b, retry.JobID, retry.StepID, 2)
	want := "disk full on /var (not retried: its expires_at " + expires.Format(time.RFC3339) + " passed)"
	if r.Status != protocol.ResultFailed || r.ErrorClass != protocol.ClassPermanent || r.Error != want {
		t.Fatalf("expired retry reported %q (%s, %s), want %q (failed, permanent)", r.Error, r.Status, r.ErrorClass, want)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want once (the expired retry unrun)", n)
	}

	// A retry whose attempt 1 ran elsewhere.
	other := protocol.Task{JobID: "elsewhere", StepID: "s", Action: "flaky", Token: "tok-3", Epoch: 3, Attempt: 2, ExpiresAt: expires}
	b.publish(t, other)
	r = resultOfEpoch(t, b, other.JobID, other.StepID, 3)
	want = "expired: attempt 2, a retry, not started by " + expires.Format(time.RFC3339) +
		"; not retried: the step's error is that of its attempt before, in its attempts"
	if r.Error != want || r.ErrorClass != protocol.ClassPermanent {
		t.Fatalf("expired retry without its earlier error reported %q (%s), want %q", r.Error, r.ErrorClass, want)
	}
}

// resultOfEpoch waits for the stored result of job/step at epoch.
func resultOfEpoch(t *testing.T, b *bundle, job, step string, epoch uint64) protocol.Result {
	t.Helper()
	s, err := b.js.Stream(context.Background(), protocol.StreamResults)
	if err != nil {
		t.Fatal(err)
	}
	var r protocol.Result
	natstest.Eventually(t, 20*time.Second, fmt.Sprintf("result of %s/%s at epoch %d", job, step, epoch), func() bool {
		m, err := s.GetLastMsgForSubject(context.Background(), "warden.result.*.*.*."+job+"."+step)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		r = protocol.Result{}
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Fatal(err)
		}
		return r.Epoch == epoch
	})
	return r
}

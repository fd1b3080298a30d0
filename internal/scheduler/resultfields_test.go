package scheduler_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/protocol"
)

// A result whose identity (job, step, epoch, token, agent, status) decodes
// is applied even if an optional field does not: that field is treated as
// absent and an event names it. Before, one such field (a timestamp
// without its zone, as Python's isoformat() writes it, or "retry_after":
// "5") made the whole result undecodable: the step waited for its lease
// and ran again, and the agent's own Nats-Msg-Id kept a corrected copy out
// for two minutes.
func TestResultWithABadOptionalFieldIsApplied(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	startMute(t, b, "mute")
	cases := []struct {
		job    string
		extra  string // the body's optional fields
		want   jobstore.JobState
		fields string // data.fields of the event
		error  string // the step's last_error, if it failed
	}{
		{"job-naive-times", `"status":"succeeded","started_at":"2026-01-02T03:04:05.123456","finished_at":"2026-01-02T03:04:06"`,
			jobstore.JobSucceeded, "started_at,finished_at", ""},
		{"job-retry-after-string", `"status":"failed","error":"disk full","error_class":"permanent","retry_after":"5"`,
			jobstore.JobFailed, "retry_after", "disk full"},
		{"job-error-object", `"status":"failed","error":{"code":7},"error_class":"permanent","truncated":"no"`,
			jobstore.JobFailed, "truncated,error", `{"code":7}`},
	}
	for _, c := range cases {
		b.submitNoReply(t, []byte(`{"name":"r","steps":[{"id":"s","action":"echo"}]}`), c.job)
	}
	for _, c := range cases {
		var st *jobstore.Step
		natstest.Eventually(t, 10*time.Second, c.job+" dispatched", func() bool {
			var err error
			st, _, err = b.store.Step(context.Background(), c.job, "s")
			return err == nil && st.State == jobstore.StepDispatched
		})
		m := nats.NewMsg(protocol.ResultSubject("default", "mute", c.job, "s"))
		m.Data = []byte(`{"job_id":"` + c.job + `","step_id":"s","epoch":` + strconv.FormatUint(st.Epoch, 10) +
			`,"token":"` + st.Token + `","agent":"mute","pool":"default",` + c.extra + `}`)
		m.Header.Set(protocol.HeaderMsgID, protocol.ResultMsgID(c.job, "s", st.Epoch, st.Token))
		if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cases {
		var rejected []protocol.Event
		natstest.Eventually(t, 10*time.Second, c.job+" ended or its result refused", func() bool {
			rejected = b.events(t, protocol.EventResultRejected, c.job)
			j, _, err := b.store.Job(context.Background(), c.job)
			return len(rejected) > 0 || (err == nil && j.State.Terminal())
		})
		if len(rejected) > 0 {
			t.Fatalf("%s: result refused (%s): %s", c.job, rejected[0].Data["reason"], rejected[0].Reason)
		}
		j := b.waitJob(t, c.job, c.want)
		st, _, err := b.store.Step(context.Background(), c.job, "s")
		if err != nil {
			t.Fatal(err)
		}
		if c.error != "" && !strings.Contains(st.LastError, c.error) {
			t.Errorf("%s: last_error %q, want it to hold %q", c.job, st.LastError, c.error)
		}
		natstest.Eventually(t, 10*time.Second, c.job+" result_fields_ignored", func() bool {
			for _, e := range b.events(t, protocol.EventResultFieldsIgnored, c.job) {
				if e.StepID == "s" && e.Agent == "mute" && e.Data["fields"] == c.fields && e.Data["epoch"] == strconv.FormatUint(st.Epoch, 10) {
					return true
				}
			}
			return false
		})
		t.Logf("%s: job %s, step %s", c.job, j.State, st.State)
	}
}

// A result whose identity does not decode is refused, and its event still
// says whose it was: the step and agent from the subject, the epoch if it
// decoded.
func TestUndecodableResultEventNamesTheStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	startMute(t, b, "mute")
	b.submitNoReply(t, []byte(`{"name":"r","steps":[{"id":"s","action":"echo"}]}`), "job-bad-epoch")
	natstest.Eventually(t, 10*time.Second, "dispatched", func() bool {
		st, _, err := b.store.Step(context.Background(), "job-bad-epoch", "s")
		return err == nil && st.State == jobstore.StepDispatched
	})
	m := nats.NewMsg(protocol.ResultSubject("default", "mute", "job-bad-epoch", "s"))
	m.Data = []byte(`{"job_id":"job-bad-epoch","step_id":"s","epoch":"1","agent":"mute","status":"succeeded"}`)
	if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, "undecodable event naming the step", func() bool {
		for _, e := range b.events(t, protocol.EventResultRejected, "job-bad-epoch") {
			if e.Data["reason"] == "undecodable" && e.StepID == "s" && e.Agent == "mute" {
				return true
			}
		}
		return false
	})
}

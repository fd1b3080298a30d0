package scheduler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/handagent"
)

// Forged and unusable results are refused with an event naming why; none
// changes the step, and none keeps the genuine result from being applied.
func TestForgedAndUnusableResultsAreRejected(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	release := startHolder(t, b)
	b.submitNoReply(t, []byte(`{"name":"f","steps":[{"id":"s","action":"echo"}]}`), "job-forged")
	var st *jobstore.Step
	var rev uint64
	natstest.Eventually(t, 10*time.Second, "dispatched", func() bool {
		var err error
		st, rev, err = b.store.Step(context.Background(), "job-forged", "s")
		return err == nil && st.State == jobstore.StepDispatched
	})
	now := time.Now().UTC()
	good := protocol.Result{JobID: "job-forged", StepID: "s", Epoch: st.Epoch, Agent: "holder", Pool: "default",
		Status: protocol.ResultSucceeded, StartedAt: now, FinishedAt: now, Token: "0123456789abcdef0123456789abcdef"}
	cases := []struct {
		reason  string
		subject string
		body    []byte
	}{
		{"wrong_token", protocol.ResultSubject("default", "holder", "job-forged", "s"), mustJSON(t, good)},
		{"wrong_agent", protocol.ResultSubject("default", "evil", "job-forged", "s"), mustJSON(t, with(good, func(r *protocol.Result) { r.Agent = "evil" }))},
		// The holder's id in another pool, with the holder's own token.
		{"wrong_agent", protocol.ResultSubject("staging", "holder", "job-forged", "s"), mustJSON(t, with(good, func(r *protocol.Result) {
			r.Pool, r.Token = "staging", st.Token
		}))},
		{"subject_mismatch", protocol.ResultSubject("default", "evil", "job-forged", "s"), mustJSON(t, good)},
		{"bad_status", protocol.ResultSubject("default", "holder", "job-forged", "s"), mustJSON(t, with(good, func(r *protocol.Result) { r.Status = "bogus" }))},
		{"unknown_step", protocol.ResultSubject("default", "holder", "job-forged", "nope"), mustJSON(t, with(good, func(r *protocol.Result) { r.StepID = "nope" }))},
		{"unknown_job", protocol.ResultSubject("default", "holder", "job-none", "s"), mustJSON(t, with(good, func(r *protocol.Result) { r.JobID = "job-none" }))},
		{"undecodable", protocol.ResultSubject("default", "holder", "job-forged", "s"), []byte("{not json")},
	}
	for i, c := range cases {
		m := nats.NewMsg(c.subject)
		m.Data = c.body
		// A forger may take the id a genuine result would have had if it
		// did not include the token: it must not matter.
		m.Header.Set(protocol.HeaderMsgID, protocol.ResultMsgID("job-forged", "s", st.Epoch, "")+string(rune('a'+i)))
		if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatalf("%s: %v", c.reason, err)
		}
	}
	for _, c := range cases {
		job := "job-forged"
		if c.reason == "unknown_job" {
			job = "job-none"
		}
		natstest.Eventually(t, 10*time.Second, "result_rejected "+c.reason, func() bool {
			for _, e := range b.events(t, protocol.EventResultRejected, job) {
				if e.Data["reason"] == c.reason && e.Reason != "" {
					return true
				}
			}
			return false
		})
	}
	after, rev2, err := b.store.Step(context.Background(), "job-forged", "s")
	if err != nil || rev2 != rev || after.State != jobstore.StepDispatched {
		t.Fatalf("a rejected result changed the step: rev %d -> %d, state %s, %v", rev, rev2, after.State, err)
	}
	release()
	j := b.waitJob(t, "job-forged", jobstore.JobSucceeded)
	t.Logf("genuine result applied after %d rejected ones; job %s", len(cases), j.State)
}

// The spec's idempotency key is honoured however the job arrives, and a
// submission naming its job two different ways is refused.
func TestIdempotencyKeyHonouredWithoutHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	handagent.Start(t, b.js, "default", "idem", nil)
	body := []byte(`{"name":"i","idempotency_key":"deploy-42","steps":[{"id":"s","action":"echo"}]}`)
	for range 2 {
		if _, err := b.js.Publish(context.Background(), protocol.SubjectSubmit, body); err != nil {
			t.Fatal(err)
		}
	}
	id := protocol.JobIDForKey("deploy-42")
	b.waitJob(t, id, jobstore.JobSucceeded)
	natstest.Eventually(t, 10*time.Second, "both submissions handled", func() bool {
		return pending(t, b.js, protocol.StreamSubmit) == 0
	})
	if n := len(attempts(t, b, id)); n != 1 {
		t.Fatalf("the job ran %d times, want once", n)
	}
	r := b.submit(t, body, "some-other-id", "")
	if r.Error == "" || r.JobID != "some-other-id" {
		t.Fatalf("header disagreeing with the idempotency key was accepted: %+v", r)
	}
	natstest.Eventually(t, 10*time.Second, "rejection event", func() bool {
		for _, e := range b.events(t, protocol.EventSubmissionRejected, "some-other-id") {
			if e.Data["reason"] == "id_mismatch" {
				return true
			}
		}
		return false
	})
}

// attempts returns the dispatches of a job's only step.
func attempts(t *testing.T, b *bundle, id string) []jobstore.Attempt {
	t.Helper()
	st, _, err := b.store.Step(context.Background(), id, "s")
	if err != nil {
		t.Fatal(err)
	}
	return st.Attempts
}

func pending(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func with(r protocol.Result, f func(*protocol.Result)) protocol.Result {
	f(&r)
	return r
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// events reads the events of a kind about an id so far.
func (b *bundle) events(t *testing.T, kind protocol.EventKind, id string) []protocol.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := b.js.OrderedConsumer(ctx, protocol.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{protocol.EventSubject(kind, id)}})
	if err != nil {
		t.Fatal(err)
	}
	var out []protocol.Event
	for {
		m, err := c.Next(jetstream.FetchMaxWait(200 * time.Millisecond))
		if err != nil {
			return out
		}
		var e protocol.Event
		if json.Unmarshal(m.Data(), &e) == nil {
			out = append(out, e)
		}
	}
}

// A submitter chooses the Warden-Reply-To subject, and the scheduler
// answers with its own permissions: an answer anywhere but an inbox would
// let a publisher write the job store, task subjects or leases. Before,
// the reply overwrote the victim job's record.
func TestReplyToOutsideAnInboxIsNotAnswered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	victim := b.submit(t, []byte(`{"name":"victim","steps":[{"id":"s","action":"echo"}]}`), "victim", "")
	if victim.Error != "" {
		t.Fatal(victim.Error)
	}
	sink, err := b.nc.SubscribeSync("evil.sink")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for i, to := range []string{protocol.JobKey("victim"), "evil.sink"} {
		if strings.HasPrefix(to, "job.") {
			to = "$KV." + protocol.BucketJobs + "." + to
		}
		msg := nats.NewMsg(protocol.SubmitSubject("attacker"))
		msg.Data = []byte(`{"name":"attacker","steps":[{"id":"s","action":"echo"}]}`)
		msg.Header.Set(protocol.HeaderJobID, "attacker")
		msg.Header.Set(protocol.HeaderMsgID, fmt.Sprintf("attacker-%d", i))
		msg.Header.Set(protocol.HeaderReplyTo, to)
		if _, err := b.js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
	// The same job again, answered on an inbox: the scheduler handles one
	// job's submissions in order, so once this answer is here the two
	// before it have been handled (and answered, had they been).
	if r := b.submit(t, []byte(`{"name":"attacker","steps":[{"id":"s","action":"echo"}]}`), "attacker", "attacker-2"); r.Error != "" || r.JobID != "attacker" {
		t.Fatalf("third submission of attacker: %+v", r)
	}
	if n, _, _ := sink.Pending(); n != 0 {
		t.Fatalf("%d answers published on evil.sink", n)
	}
	j, _, err := b.store.Job(context.Background(), "victim")
	if err != nil || j.Name != "victim" {
		t.Fatalf("victim's record was overwritten: %+v, %v", j, err)
	}
}

// A submission whose job record would not fit one message (max_spec_bytes
// raised to the payload limit, a single-step job's record holding its spec
// and its step's params) is refused with a reason. Before, the record's
// create failed with "maximum payload exceeded" and the submission was
// handed back every few seconds for ever: never stored, never refused.
func TestSubmissionWhoseRecordCannotFitIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{MaxSpecBytes: 1 << 20})
	blob := strings.Repeat("x", 600<<10)
	r := b.submit(t, []byte(`{"name":"big","steps":[{"id":"s","action":"echo","params":{"b":"`+blob+`"}}]}`), "job-big", "")
	if r.Error == "" || !strings.Contains(r.Error, "max_payload") {
		t.Fatalf("a job whose record cannot be written was answered %+v, want a refusal naming max_payload", r)
	}
	natstest.Eventually(t, 10*time.Second, "submission_rejected too_large", func() bool {
		for _, e := range b.events(t, protocol.EventSubmissionRejected, "job-big") {
			if e.Data["reason"] == "too_large" {
				return true
			}
		}
		return false
	})
	natstest.Eventually(t, 10*time.Second, "the submission settled", func() bool {
		return pending(t, b.js, protocol.StreamSubmit) == 0
	})
	if _, _, err := b.store.Job(context.Background(), "job-big"); err == nil {
		t.Error("the refused job was stored")
	}
}

// A result whose output would make its step's record larger than one
// message (an agent in another language, not bound by the Go SDK's
// max_result_bytes) fails the step for good, saying why. Before, the
// record's write failed and the result was handed back for ever; the step
// waited for its lease, was run again, and the same happened.
func TestResultTooLargeForItsRecordFailsTheStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	release := startHolder(t, b)
	params := strings.Repeat("p", 200<<10)
	b.submitNoReply(t, []byte(`{"name":"out","steps":[{"id":"s","action":"echo","params":{"p":"`+params+`"}}]}`), "job-out")
	var st *jobstore.Step
	natstest.Eventually(t, 10*time.Second, "dispatched", func() bool {
		var err error
		st, _, err = b.store.Step(context.Background(), "job-out", "s")
		return err == nil && st.State == jobstore.StepDispatched
	})
	now := time.Now().UTC()
	out := mustJSON(t, map[string]string{"o": strings.Repeat("o", 700<<10)})
	if err := handagent.PublishResult(context.Background(), b.js, protocol.Result{JobID: "job-out", StepID: "s", Epoch: st.Epoch,
		Agent: "holder", Pool: "default", Status: protocol.ResultSucceeded, Output: out, StartedAt: now, FinishedAt: now, Token: st.Token}); err != nil {
		t.Fatal(err)
	}
	b.waitJobWithin(t, "job-out", jobstore.JobFailed, 20*time.Second)
	release() // the holder's own result, stale now, while the connection is up
	st, _, err := b.store.Step(context.Background(), "job-out", "s")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != jobstore.StepFailed || !strings.Contains(st.LastError, "max_payload") || len(st.Output) != 0 {
		t.Errorf("step %s, error %q, %d bytes of output; want failed, naming max_payload, without the output", st.State, st.LastError, len(st.Output))
	}
}

// startHolder starts agent "holder" of the default pool, which holds each
// task until release is called (or the test ends) and then succeeds.
func startHolder(t *testing.T, b *bundle) (release func()) {
	a := handagent.Start(t, b.js, "default", "holder", nil)
	ch := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	a.Reply(func(protocol.Task) protocol.Result {
		<-ch
		return protocol.Result{Status: protocol.ResultSucceeded}
	})
	return release
}

// A small result can push a record near the limit over it (a single-step
// job's record holds its params twice): applied again as it was, it made
// the same record, was handed back, and came back to do so until its
// step's lease ended. The second time, every result of the turn loses its
// output, so the step ends.
func TestSmallResultOverTheLimitStillEndsTheStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{MaxSpecBytes: 1 << 20})
	release := startHolder(t, b)
	kv, err := b.js.KeyValue(context.Background(), protocol.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	// The record's size beside its params, measured on a dispatched job.
	dispatched := func(id string, params int) (*jobstore.Step, int) {
		b.submitNoReply(t, []byte(`{"name":"near","steps":[{"id":"s","action":"echo","params":{"p":"`+strings.Repeat("p", params)+`"}}]}`), id)
		var st *jobstore.Step
		natstest.Eventually(t, 10*time.Second, id+" dispatched", func() bool {
			var err error
			st, _, err = b.store.Step(context.Background(), id, "s")
			return err == nil && st.State == jobstore.StepDispatched
		})
		e, err := kv.Get(context.Background(), protocol.JobKey(id))
		if err != nil {
			t.Fatal(err)
		}
		return st, len(e.Value())
	}
	const p0 = 400 << 10
	_, size0 := dispatched("job-measure", p0)
	overhead := size0 - 2*p0
	// A record 1,500 bytes below the limit once dispatched; 3,000 bytes
	// of output (below tooLargeKeepBytes' 4 KiB) take it over.
	p1 := (int(b.nc.MaxPayload()) - overhead - 1500) / 2
	st, size1 := dispatched("job-near", p1)
	t.Logf("record of job-near: %d bytes of %d", size1, b.nc.MaxPayload())
	now := time.Now().UTC()
	out := mustJSON(t, map[string]string{"o": strings.Repeat("o", 3000)})
	if err := handagent.PublishResult(context.Background(), b.js, protocol.Result{JobID: "job-near", StepID: "s", Epoch: st.Epoch,
		Agent: "holder", Pool: "default", Status: protocol.ResultSucceeded, Output: out, StartedAt: now, FinishedAt: now, Token: st.Token}); err != nil {
		t.Fatal(err)
	}
	b.waitJobWithin(t, "job-near", jobstore.JobFailed, 20*time.Second)
	release()
	st, _, err = b.store.Step(context.Background(), "job-near", "s")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != jobstore.StepFailed || !strings.Contains(st.LastError, "max_payload") || len(st.Output) != 0 {
		t.Errorf("step %s, error %q, %d bytes of output; want failed, naming max_payload, without the output", st.State, st.LastError, len(st.Output))
	}
}

// A step of a multi-step job keeps its own record: an output that makes it
// too large ends the step as for a one-step job (its record holds the
// step's params and output, not the job's).
func TestMultiStepResultTooLargeFailsTheStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{MaxSpecBytes: 1 << 20})
	release := startHolder(t, b)
	params := strings.Repeat("p", 350<<10)
	b.submitNoReply(t, []byte(`{"name":"out","steps":[{"id":"s","action":"echo","params":{"p":"`+params+`"}},{"id":"t","action":"echo"}]}`), "job-multi")
	var st *jobstore.Step
	natstest.Eventually(t, 10*time.Second, "dispatched", func() bool {
		var err error
		st, _, err = b.store.Step(context.Background(), "job-multi", "s")
		return err == nil && st.State == jobstore.StepDispatched
	})
	now := time.Now().UTC()
	out := mustJSON(t, map[string]string{"o": strings.Repeat("o", 700<<10)})
	if err := handagent.PublishResult(context.Background(), b.js, protocol.Result{JobID: "job-multi", StepID: "s", Epoch: st.Epoch,
		Agent: "holder", Pool: "default", Status: protocol.ResultSucceeded, Output: out, StartedAt: now, FinishedAt: now, Token: st.Token}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 20*time.Second, "step s ended", func() bool {
		st, _, err := b.store.Step(context.Background(), "job-multi", "s")
		return err == nil && st.State.Terminal()
	})
	release()
}

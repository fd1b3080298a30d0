package api_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// TestRetryJobPartialFailure: a job retry that reopens a step and then
// fails on the next still asks a scheduler to advance the job, so the
// reopened step runs now, and its error says which steps it reopened.
//
// The fault: step b's record is a few bytes under the connection's
// maximum payload, so reopening step a (which rewrites b as it is)
// succeeds, and reopening b (which lengthens its last_error) cannot be
// written.
func TestRetryJobPartialFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)

	// A scheduler's part: record each advance request and answer it.
	kicks := make(chan string, 8)
	sub, err := b.nc.Subscribe(protocol.SubjectControlAdvance, func(m *nats.Msg) {
		kicks <- string(m.Data)
		_ = m.Respond(protocol.OKReply(""))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	const id = "job-partial"
	now := time.Now().UTC()
	sp := spec.Job{Name: "partial", Steps: []spec.Step{{ID: "a", Action: "echo"}, {ID: "b", Action: "echo"}}}
	steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range steps {
		st.State, st.Epoch, st.Attempt, st.LastError = jobstore.StepFailed, 1, 1, "exit status 1"
	}
	// What nats.go holds against the server's max_payload: the headers
	// and the data, not the subject.
	big := steps[1]
	size := func() int {
		m := b.store.StepWrite(big, 0).Msg
		return m.Size() - len(m.Subject)
	}
	limit := int(b.nc.MaxPayload())
	big.Params = json.RawMessage(`""`)
	big.Params = json.RawMessage(`"` + strings.Repeat("x", limit-8-size()) + `"`)
	if n := size(); n != limit-8 {
		t.Fatalf("step b's record is %d bytes, want %d (8 under the maximum payload)", n, limit-8)
	}
	for _, st := range steps {
		if _, err := b.store.CreateStep(ctx(t), st); err != nil {
			t.Fatal(err)
		}
	}
	j := jobstore.NewJob(id, sp, now)
	j.State, j.Error, j.FinishedAt = jobstore.JobFailed, "step a failed", now
	if _, err := b.store.CreateJob(ctx(t), j); err != nil {
		t.Fatal(err)
	}

	r := b.call(t, "POST", "/api/v1/jobs/"+id+"/retry", adminToken, nil)
	var e struct {
		Error struct {
			Code     string   `json:"code"`
			Message  string   `json:"message"`
			Status   int      `json:"status"`
			Reopened []string `json:"reopened"`
		} `json:"error"`
	}
	r.decode(t, &e)
	if r.status < 400 || e.Error.Status != r.status || e.Error.Code == "" {
		t.Fatalf("retry: %d %s, want an error", r.status, r.body)
	}
	if !slices.Equal(e.Error.Reopened, []string{"a"}) || !strings.Contains(e.Error.Message, "reopened a") {
		t.Errorf("retry's error does not say that step a was reopened: %s", r.body)
	}

	// Step a is pending and its job running again; b stayed failed.
	st, _, err := b.store.Step(ctx(t), id, "a")
	if err != nil || st.State != jobstore.StepPending {
		t.Fatalf("step a: %v %v, want pending", st, err)
	}
	if job, _, err := b.store.Job(ctx(t), id); err != nil || job.State != jobstore.JobRunning {
		t.Fatalf("job: %v %v, want running", job, err)
	}
	if st, _, err := b.store.Step(ctx(t), id, "b"); err != nil || st.State != jobstore.StepFailed {
		t.Fatalf("step b: %v, want failed", err)
	}

	select {
	case got := <-kicks:
		if got != id {
			t.Fatalf("advance asked for %q, want %q", got, id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no scheduler was asked to advance the job after a retry that reopened step a")
	}
}

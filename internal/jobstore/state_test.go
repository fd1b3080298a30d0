package jobstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
)

func step(id string, state jobstore.StepState, deps ...string) *jobstore.Step {
	return &jobstore.Step{ID: id, State: state, Desired: jobstore.StepSucceeded, DependsOn: deps}
}

func ids(steps []*jobstore.Step) []string {
	var out []string
	for _, s := range steps {
		out = append(out, s.ID)
	}
	return out
}

func TestEvaluate(t *testing.T) {
	t.Parallel()
	P, D, S, F := jobstore.StepPending, jobstore.StepDispatched, jobstore.StepSucceeded, jobstore.StepFailed
	cases := []struct {
		name  string
		steps []*jobstore.Step
		ready []string
		skip  []string
		state jobstore.JobState
	}{
		{"fresh diamond", []*jobstore.Step{step("a", P), step("b", P, "a"), step("c", P, "a"), step("d", P, "b", "c")},
			[]string{"a"}, nil, jobstore.JobPending},
		{"fan out", []*jobstore.Step{step("a", S), step("b", P, "a"), step("c", P, "a"), step("d", P, "b", "c")},
			[]string{"b", "c"}, nil, jobstore.JobRunning},
		{"join waits", []*jobstore.Step{step("a", S), step("b", S, "a"), step("c", D, "a"), step("d", P, "b", "c")},
			nil, nil, jobstore.JobRunning},
		{"failure skips transitively", []*jobstore.Step{step("a", F), step("b", P, "a"), step("c", P, "b"), step("x", S)},
			nil, []string{"b", "c"}, jobstore.JobFailed},
		{"failure waits for running branch", []*jobstore.Step{step("a", S), step("b", F, "a"), step("c", D, "a"), step("d", P, "b", "c")},
			nil, []string{"d"}, jobstore.JobRunning},
		{"all done", []*jobstore.Step{step("a", S), step("b", S, "a")}, nil, nil, jobstore.JobSucceeded},
	}
	for _, c := range cases {
		p := jobstore.Evaluate(c.steps)
		if got := ids(p.Ready); !equal(got, c.ready) {
			t.Errorf("%s: ready %v, want %v", c.name, got, c.ready)
		}
		if got := ids(p.Skip); !equal(got, c.skip) {
			t.Errorf("%s: skip %v, want %v", c.name, got, c.skip)
		}
		if p.State != c.state {
			t.Errorf("%s: state %s, want %s", c.name, p.State, c.state)
		}
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestApplyResultFencesEpochs(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	s := &jobstore.Step{JobID: "j", ID: "s", State: jobstore.StepPending, Desired: jobstore.StepSucceeded, MaxRetries: 1, Timeout: protocol.Duration(time.Minute)}
	if err := s.Dispatch("a1", "", now, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if s.Epoch != 1 || s.Actor != "a1" || !s.LockedUntil.Equal(now.Add(90*time.Second)) {
		t.Fatalf("dispatch wrote %+v", s)
	}
	if _, err := s.ApplyResult(protocol.Result{Epoch: 2, Status: protocol.ResultSucceeded}, true, now); !errors.Is(err, jobstore.ErrStale) {
		t.Fatalf("future epoch accepted: %v", err)
	}
	out, err := s.ApplyResult(protocol.Result{Epoch: 1, Status: protocol.ResultFailed, Error: "boom"}, true, now)
	if err != nil || out != jobstore.OutcomeRetry || s.State != jobstore.StepPending {
		t.Fatalf("retriable failure: %v %v %s", out, err, s.State)
	}
	if _, err := s.ApplyResult(protocol.Result{Epoch: 1, Status: protocol.ResultSucceeded}, true, now); !errors.Is(err, jobstore.ErrStale) {
		t.Fatalf("result for an ended epoch accepted: %v", err)
	}
	_ = s.Dispatch("a2", "", now, 0)
	out, _ = s.ApplyResult(protocol.Result{Epoch: 2, Status: protocol.ResultFailed, Error: "boom"}, true, now)
	if out != jobstore.OutcomeFailed || s.State != jobstore.StepFailed || s.ErrorCount != 2 || len(s.Attempts) != 2 {
		t.Fatalf("retries exhausted: %v %+v", out, s)
	}
	if err := s.Dispatch("a3", "", now, 0); err == nil {
		t.Fatal("dispatched a failed step")
	}
}

func TestReleaseCountsOnlySuspects(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	s := &jobstore.Step{JobID: "j", ID: "s", State: jobstore.StepPending, Desired: jobstore.StepSucceeded}
	_ = s.Dispatch("a1", "", now, 0)
	if err := s.Release("transferred", "agent a1 failed", false, now); err != nil {
		t.Fatal(err)
	}
	if s.Recoveries != 0 || s.State != jobstore.StepPending || s.TransferredFrom != "a1" || s.Attempts[0].Status != "transferred" {
		t.Fatalf("queued-only transfer: %+v", s)
	}
	_ = s.Dispatch("a2", "", now, 0)
	_ = s.Release("lease_expired", "lease expired", true, now)
	if s.Recoveries != 1 || s.Epoch != 2 || s.Attempt != 0 {
		t.Fatalf("in-flight release: recoveries %d epoch %d attempt %d", s.Recoveries, s.Epoch, s.Attempt)
	}
	if err := s.Release("lease_expired", "again", true, now); err == nil {
		t.Fatal("released a step that is not dispatched")
	}
}

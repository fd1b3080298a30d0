package client_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// leased writes job id as the scheduler would right after dispatching its
// first step to agent-1, with a fresh lease token, and returns that token.
// An inline job keeps its steps in the job record.
func leased(t *testing.T, b bundle, id string, inline bool) string {
	t.Helper()
	sp := spec.Job{Name: "leased", Steps: []spec.Step{{ID: "a", Action: "echo", Params: map[string]any{"message": "hi"}}}}
	if !inline {
		sp.Steps = append(sp.Steps, spec.Step{ID: "b", Action: "echo", DependsOn: []string{"a"}})
	}
	now := time.Now().UTC()
	steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	token := protocol.NewLeaseToken()
	if err := steps[0].Dispatch("agent-1", token, now, time.Second); err != nil {
		t.Fatal(err)
	}
	j := jobstore.NewJob(id, sp, now)
	j.State = jobstore.JobRunning
	if inline {
		j.Inline, j.Steps = true, steps
	} else {
		for _, s := range steps {
			if _, err := b.store.CreateStep(ctx(t), s); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := b.store.CreateJob(ctx(t), j); err != nil {
		t.Fatal(err)
	}
	// The store keeps it (a scheduler taking the job over needs it).
	if st, _, err := b.store.Step(ctx(t), id, "a"); err != nil || st.Token != token {
		t.Fatalf("stored step a: %+v %v", st, err)
	}
	return token
}

// noToken fails if v, as JSON, has a "token" member or holds one of tokens.
func noToken(t *testing.T, what string, v any, tokens ...string) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(b), `"token"`)
	for _, tok := range tokens {
		if j := strings.Index(string(b), tok); i < 0 && j >= 0 {
			i = j
		}
	}
	if i >= 0 {
		t.Errorf("%s shows a lease token: ...%s...", what, b[max(i-40, 0):min(i+60, len(b))])
	}
}

// leasedStep checks the view still shows step a leased: dispatched, its
// actor, epoch, lease and params.
func leasedStep(t *testing.T, what string, s *client.Step) {
	t.Helper()
	if s == nil || s.ID != "a" || s.State != client.StepDispatched || s.Actor != "agent-1" || s.LockedUntil.IsZero() || s.Epoch != 1 || string(s.Params) != `{"message":"hi"}` {
		t.Errorf("%s: step a %+v, want it dispatched to agent-1 with its lease", what, s)
	}
}

// A step's lease token is half of its result's dedup id: a reader who
// learns it can take that id first and the genuine result is dropped as a
// duplicate. Job, Jobs and Follow never return it; the rest of the
// records is unchanged.
func TestViewsHideTheLeaseToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, inline := range []bool{false, true} {
		id := map[bool]string{false: "job-steps", true: "job-inline"}[inline]
		token := leased(t, b, id, inline)

		d, err := b.client.Job(ctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		noToken(t, "Job("+id+")", d, token)
		if len(d.Steps) == 0 {
			t.Fatalf("Job(%s): no steps", id)
		}
		leasedStep(t, "Job("+id+")", d.Steps[0])
		if inline {
			if len(d.Job.Steps) != 1 {
				t.Fatalf("Job(%s): inline steps %+v", id, d.Job.Steps)
			}
			leasedStep(t, "Job("+id+").Job.Steps", d.Job.Steps[0])
		}

		// The store's record is untouched by the view.
		if st, _, err := b.store.Step(ctx(t), id, "a"); err != nil || st.Token != token {
			t.Fatalf("stored step a after Job: %+v %v", st, err)
		}

		fctx, cancel := context.WithTimeout(ctx(t), 10*time.Second)
		var initial client.Update
		_, err = b.client.Follow(fctx, id, func(u client.Update) {
			if u.Initial {
				initial = u
				cancel()
			}
		})
		cancel()
		if !initial.Initial || initial.Job == nil || len(initial.Steps) == 0 {
			t.Fatalf("Follow(%s): no initial update (%v)", id, err)
		}
		noToken(t, "Follow("+id+") initial update", initial, token)
		leasedStep(t, "Follow("+id+")", initial.Steps[0])
	}

	all, err := b.client.Jobs(ctx(t), client.JobFilter{})
	if err != nil || len(all.Jobs) != 2 {
		t.Fatalf("Jobs: %+v %v", all, err)
	}
	noToken(t, "Jobs", all)
}

// A change Follow reports (a step dispatched while it watches) carries no
// token either.
func TestFollowUpdatesHideTheLeaseToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	leased(t, b, "job-f", false)
	fctx, cancel := context.WithTimeout(ctx(t), 20*time.Second)
	defer cancel()
	ready := make(chan struct{})
	updates := make(chan client.Update, 16)
	done := make(chan error, 1)
	go func() {
		_, err := b.client.Follow(fctx, "job-f", func(u client.Update) {
			if u.Initial {
				close(ready)
				return
			}
			updates <- u
		})
		done <- err
	}()
	select {
	case <-ready:
	case <-fctx.Done():
		t.Fatal("Follow: no initial update")
	}
	token := protocol.NewLeaseToken()
	st, rev, err := b.store.Step(ctx(t), "job-f", "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Dispatch("agent-2", token, time.Now().UTC(), time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.UpdateStep(ctx(t), st, rev); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case u := <-updates:
			if u.Step == nil || u.Step.ID != "b" {
				continue
			}
			noToken(t, "Follow update", u, token)
			if u.Step.State != client.StepDispatched || u.Step.Actor != "agent-2" {
				t.Fatalf("update of b: %+v", u.Step)
			}
			cancel()
			<-done
			return
		case <-fctx.Done():
			t.Fatal("Follow: no update for the dispatch of b")
		}
	}
}

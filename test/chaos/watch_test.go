package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
)

// transitionWatch follows every job and step record of the job store
// (job.<id>, with the steps of an inline job inside it, and
// step.<job>.<step>) and records the transitions it sees. The bucket keeps
// one revision per key, so a watcher that lags sees only some of a key's
// revisions: a step that went succeeded → pending → succeeded can arrive
// as two "succeeded" updates. A second success is therefore told apart by
// its epoch or finish time, not by the state before it.
//
// Violations: a step that succeeded twice (two successes with different
// epochs or finish times), a step or job that left a terminal state, a job
// that ended twice (same terminal state, another finish time).
type transitionWatch struct {
	mu        sync.Mutex
	steps     map[string]*seenStep
	jobs      map[string]*seenJob
	problems  []string
	ended     string // why the watch stopped before the test did
	updates   int
	lastRev   uint64
	cancelled bool
}

type seenStep struct {
	state     jobstore.StepState
	successes int
	epoch     uint64 // of the last success
	finished  time.Time
	rev       uint64
}

type seenJob struct {
	state    jobstore.JobState
	finished time.Time
	rev      uint64
}

func startTransitionWatch(ctx context.Context, t *testing.T, js jetstream.JetStream) *transitionWatch {
	t.Helper()
	w := &transitionWatch{steps: map[string]*seenStep{}, jobs: map[string]*seenJob{}}
	kv, _ := waitKV(ctx, t, js, protocol.BucketJobs)
	watcher, err := kv.WatchFiltered(ctx, []string{"job.*", "step.>"})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer func() { _ = watcher.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-watcher.Updates():
				if !ok {
					w.mu.Lock()
					if ctx.Err() == nil && !w.cancelled {
						w.ended = fmt.Sprintf("the job store watch's updates channel closed after %d updates (last revision %d)", w.updates, w.lastRev)
					}
					w.mu.Unlock()
					return
				}
				if e == nil || e.Operation() != jetstream.KeyValuePut {
					continue
				}
				w.apply(e)
			}
		}
	}()
	return w
}

func (w *transitionWatch) apply(e jetstream.KeyValueEntry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.updates++
	rev := e.Revision()
	if rev <= w.lastRev {
		w.problems = append(w.problems, fmt.Sprintf("watch delivered revision %d of %s after revision %d", rev, e.Key(), w.lastRev))
	}
	w.lastRev = max(w.lastRev, rev)
	switch {
	case strings.HasPrefix(e.Key(), "job."):
		var j jobstore.Job
		if err := json.Unmarshal(e.Value(), &j); err != nil {
			w.problems = append(w.problems, fmt.Sprintf("%s@%d: undecodable job record: %v", e.Key(), rev, err))
			return
		}
		w.job(&j, rev)
		for _, st := range j.Steps {
			w.step(j.ID, st, rev)
		}
	case strings.HasPrefix(e.Key(), "step."):
		var st jobstore.Step
		if err := json.Unmarshal(e.Value(), &st); err != nil {
			w.problems = append(w.problems, fmt.Sprintf("%s@%d: undecodable step record: %v", e.Key(), rev, err))
			return
		}
		w.step(st.JobID, &st, rev)
	}
}

func (w *transitionWatch) job(j *jobstore.Job, rev uint64) {
	prev, ok := w.jobs[j.ID]
	if !ok {
		prev = &seenJob{}
		w.jobs[j.ID] = prev
	}
	if prev.state.Terminal() {
		switch {
		case j.State != prev.state:
			w.problems = append(w.problems, fmt.Sprintf("job %s left terminal state %s for %s (revision %d → %d)", j.ID, prev.state, j.State, prev.rev, rev))
		case !j.FinishedAt.Equal(prev.finished):
			w.problems = append(w.problems, fmt.Sprintf("job %s ended %s twice: finished at %s, then at %s (revision %d → %d)",
				j.ID, j.State, prev.finished.Format(time.RFC3339Nano), j.FinishedAt.Format(time.RFC3339Nano), prev.rev, rev))
		}
	}
	prev.state, prev.finished, prev.rev = j.State, j.FinishedAt, rev
}

func (w *transitionWatch) step(jobID string, st *jobstore.Step, rev uint64) {
	key := jobID + "." + st.ID
	prev, ok := w.steps[key]
	if !ok {
		prev = &seenStep{}
		w.steps[key] = prev
	}
	if prev.state != "" && prev.state.Terminal() && st.State != prev.state {
		w.problems = append(w.problems, fmt.Sprintf("step %s left terminal state %s for %s (epoch %d, actor %s; revision %d → %d)",
			key, prev.state, st.State, st.Epoch, st.Actor, prev.rev, rev))
	}
	if st.State == jobstore.StepSucceeded {
		switch {
		case prev.successes == 0:
			prev.successes = 1
		case st.Epoch != prev.epoch || !st.FinishedAt.Equal(prev.finished):
			prev.successes++
			w.problems = append(w.problems, fmt.Sprintf("step %s succeeded again: epoch %d finished %s, then epoch %d on %s finished %s (revision %d → %d)",
				key, prev.epoch, prev.finished.Format(time.RFC3339Nano), st.Epoch, st.Actor, st.FinishedAt.Format(time.RFC3339Nano), prev.rev, rev))
		}
		prev.epoch, prev.finished = st.Epoch, st.FinishedAt
	}
	prev.state, prev.rev = st.State, rev
}

// check reports the watch's violations, a watch that stopped early, and
// every final state it never saw: each step that ended succeeded must have
// been seen succeeded, each terminal job seen in its final state.
func (w *transitionWatch) check(t *testing.T, jobs map[string]*jobstore.Job, steps map[string]*jobstore.Step) (stepsSeen, jobsSeen int) {
	t.Helper()
	// The watch may trail the last write by a moment.
	deadline := time.Now().Add(10 * time.Second)
	for {
		missing := w.unseen(jobs, steps)
		if len(missing) == 0 || time.Now().After(deadline) {
			for _, m := range missing[:min(len(missing), 20)] {
				t.Errorf("job store watch: %s", m)
			}
			if len(missing) > 0 {
				t.Errorf("job store watch: %d final states never seen", len(missing))
			}
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancelled = true
	if w.ended != "" {
		t.Errorf("job store watch ended early: %s", w.ended)
	}
	for _, p := range w.problems[:min(len(w.problems), 30)] {
		t.Errorf("job store watch: %s", p)
	}
	if len(w.problems) > 30 {
		t.Errorf("job store watch: %d violations in all", len(w.problems))
	}
	for key, st := range steps {
		if s := w.steps[key]; st.State == jobstore.StepSucceeded && s != nil && s.successes > 0 {
			stepsSeen++
		}
	}
	for id, j := range jobs {
		if s := w.jobs[id]; s != nil && s.state == j.State {
			jobsSeen++
		}
	}
	return stepsSeen, jobsSeen
}

func (w *transitionWatch) unseen(jobs map[string]*jobstore.Job, steps map[string]*jobstore.Step) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for id, j := range jobs {
		if !j.State.Terminal() {
			continue
		}
		if s := w.jobs[id]; s == nil || s.state != j.State {
			got := "nothing"
			if s != nil {
				got = string(s.state)
			}
			out = append(out, fmt.Sprintf("job %s ended %s but the watch saw %s last", id, j.State, got))
		}
	}
	for key, st := range steps {
		if st.State != jobstore.StepSucceeded {
			continue
		}
		if s := w.steps[key]; s == nil || s.successes == 0 {
			out = append(out, fmt.Sprintf("step %s ended succeeded (epoch %d on %s) but the watch never saw it succeed", key, st.Epoch, st.Actor))
		}
	}
	return out
}

func (w *transitionWatch) successes() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for k, s := range w.steps {
		if s.successes > 0 {
			out[k] = s.successes
		}
	}
	return out
}

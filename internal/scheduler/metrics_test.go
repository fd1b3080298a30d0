package scheduler_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/spec"
)

// A result applied to a cached copy whose step record changed since loses
// its compare-and-set, and the turn is applied again to a fresh read: the
// result and the job's end are counted once, by the turn whose writes
// landed, not once per try.
func TestMetricsCountALostCASTurnOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := prometheus.NewRegistry()
	b.startScheduler(t, scheduler.Config{}, scheduler.WithMetrics(scheduler.NewMetrics(reg)))
	ctx := context.Background()
	now := time.Now().UTC()
	sp := spec.Job{Name: "counted", Steps: []spec.Step{{ID: "a", Action: "noop"}, {ID: "b", Action: "noop"}}}
	storeRunningJob(t, b.store, "job-counted", sp, now)
	stepState := func(id string) jobstore.StepState {
		st, _, err := b.store.Step(ctx, "job-counted", id)
		if err != nil {
			return ""
		}
		return st.State
	}
	// The scheduler reads the job for a's result and keeps it.
	b.publish(t, agentResult("job-counted", "a", now))
	natstest.Eventually(t, 10*time.Second, "a succeeded", func() bool { return stepState("a") == jobstore.StepSucceeded })
	natstest.Eventually(t, 10*time.Second, "a's result counted", func() bool {
		return counter(t, reg, "warden_results_applied_total", "succeeded") == 1
	})

	// Someone else writes b's record: the cached revision is stale, and
	// b's result, which fits the copy, loses its compare-and-set once.
	b.editStep(t, "job-counted", "b", func(st *jobstore.Step) { st.UpdatedAt = st.UpdatedAt.Add(time.Second) })
	b.publish(t, agentResult("job-counted", "b", now))
	b.waitJob(t, "job-counted", jobstore.JobSucceeded)
	natstest.Eventually(t, 10*time.Second, "the job's end counted", func() bool {
		return counter(t, reg, "warden_jobs_finished_total", "succeeded") >= 1
	})
	if got := counter(t, reg, "warden_jobs_finished_total", "succeeded"); got != 1 {
		t.Errorf("warden_jobs_finished_total{state=succeeded} = %v, want 1", got)
	}
	if got := counter(t, reg, "warden_results_applied_total", "succeeded"); got != 2 {
		t.Errorf("warden_results_applied_total{status=succeeded} = %v, want 2 (a and b, once each)", got)
	}
}

// counter is the value of name's series whose one label is label (or the
// unlabelled counter, label ""), 0 if it has none yet.
func counter(t *testing.T, g prometheus.Gatherer, name, label string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			lp := m.GetLabel()
			if (label == "" && len(lp) == 0) || (len(lp) == 1 && lp[0].GetValue() == label) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

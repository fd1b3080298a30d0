package chaos

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/wardenhq/warden/pkg/spec"
)

// featureKey is the concurrency key keyed chaos jobs share.
const featureKey = "chaos-key"

// featureJob makes a job that uses issue 13's workflow features, so that
// chaos checks its invariants (every accepted job terminal, no step
// succeeding twice, every success executed, only poison dead-lettered)
// with them in use:
//   - prioritised: a chain at low, high or critical priority, one step
//     overriding it;
//   - keyed: a chain holding concurrency key chaos-key (limit 2) with
//     every other keyed job;
//   - delayed: a chain that starts 1–3 s after submission (a message
//     schedule on warden.delay.<job>, which must survive the NATS restart);
//   - saga: two steps that declare compensations, then a step that fails
//     for good: the job must end compensated, its compensations run in
//     reverse order;
//   - timed: a job with a 3 s timeout whose second step runs 8 s: it must
//     end failed "timed out" whatever process died meanwhile (its
//     scheduler's wake or the supervisor's ask at the deadline, or at the
//     latest the slow step's result, times it out), its last step never
//     run.
func featureJob(r *rand.Rand, j job) job {
	chain := func(n int, prefix string) []stepSpec {
		var steps []stepSpec
		for s := range n {
			var deps []string
			if s > 0 {
				deps = []string{fmt.Sprintf("%s%d", prefix, s-1)}
			}
			steps = append(steps, ledgerStep(r, fmt.Sprintf("%s%d", prefix, s), deps...))
		}
		return steps
	}
	body := map[string]any{}
	switch r.IntN(5) {
	case 0:
		j.shape = "prioritised"
		steps := chain(3, "p")
		steps[1].Priority = []string{"low", "normal", "high", "critical"}[r.IntN(4)]
		body["priority"] = []string{"low", "high", "critical"}[r.IntN(3)]
		body["steps"] = steps
	case 1:
		j.shape = "keyed"
		body["concurrency"] = map[string]any{"key": featureKey, "limit": 2}
		body["steps"] = chain(2, "k")
	case 2:
		j.shape = "delayed"
		body["delay"] = fmt.Sprintf("%dms", 1000+r.IntN(2000))
		body["steps"] = chain(2, "d")
	case 3:
		j.shape, j.want, j.wantError = "timed", "failed", "timed out"
		body["timeout"] = "3s"
		slow := ledgerStep(r, "slow", "t0")
		slow.Params["duration"] = "8s"
		body["steps"] = []stepSpec{ledgerStep(r, "t0"), slow, ledgerStep(r, "t2", "slow")}
	default:
		j.shape, j.want = "saga", "compensated"
		never := 0
		a, b := ledgerStep(r, "reserve"), ledgerStep(r, "hold", "reserve")
		a.Compensate = map[string]any{"action": "ledger", "params": map[string]any{"duration": "20ms"}}
		b.Compensate = map[string]any{"action": "ledger", "params": map[string]any{"duration": "20ms"}}
		charge := stepSpec{ID: "charge", Action: "flaky", Params: map[string]any{"fail_attempts": 1000},
			DependsOn: []string{"hold"}, MaxRetries: &never}
		body["steps"] = []stepSpec{a, b, charge}
		j.undo = []string{spec.CompensationID("hold"), spec.CompensationID("reserve")}
	}
	body["name"] = j.shape
	j.spec, _ = json.Marshal(body)
	return j
}

// checkUndoOrder reports sagas whose compensations did not start in
// reverse dependency order, from the ledger's order of first executions.
func checkUndoOrder(t *testing.T, runs []ledgerRun, jobs map[string]job) (sagas int) {
	t.Helper()
	first := map[string]int{}
	for i, r := range runs {
		if _, ok := first[r.job+"."+r.step]; !ok {
			first[r.job+"."+r.step] = i
		}
	}
	for id, j := range jobs {
		if len(j.undo) == 0 {
			continue
		}
		sagas++
		prev := -1
		for _, step := range j.undo {
			at, ok := first[id+"."+step]
			if !ok {
				t.Errorf("saga %s: compensation %s never ran", id, step)
				break
			}
			if at < prev {
				t.Errorf("saga %s: compensations started out of order (%v)", id, j.undo)
			}
			prev = at
		}
	}
	return sagas
}

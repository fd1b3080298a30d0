package chaos

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
)

// job is one generated job: its spec and what the test expects of it.
type job struct {
	id     string
	shape  string
	spec   []byte
	poison string // the poison step's id, if any
	// want is the terminal state the job must reach; "" means succeeded.
	// wantError, if set, is how its error must begin.
	want, wantError string
	// undo, for a saga, lists the compensation steps in the order they
	// must start (reverse dependency order).
	undo []string
}

type stepSpec struct {
	ID         string         `json:"id"`
	Action     string         `json:"action"`
	Params     map[string]any `json:"params,omitempty"`
	DependsOn  []string       `json:"depends_on,omitempty"`
	MaxRetries *int           `json:"max_retries,omitempty"`
	Cluster    string         `json:"cluster,omitempty"`
	// Issue 13's features (features_test.go).
	Priority    string         `json:"priority,omitempty"`
	Concurrency map[string]any `json:"concurrency,omitempty"`
	Compensate  map[string]any `json:"compensate,omitempty"`
}

// chaosCluster is the active-passive agent cluster every chaos agent joins
// (docs/clusters.md); "cluster" jobs run their steps through it.
const chaosCluster = "chaos-ap"

func ledgerStep(r *rand.Rand, id string, deps ...string) stepSpec {
	ms := 20 + r.IntN(280)
	return stepSpec{ID: id, Action: "ledger", Params: map[string]any{"duration": fmt.Sprintf("%dms", ms)}, DependsOn: deps}
}

// generate makes n jobs of mixed shapes from r: chains, fan-outs, diamonds,
// chains with a transiently failing step, and a few with a poison step.
func generate(r *rand.Rand, n, poison int) []job {
	jobs := make([]job, 0, n)
	poisonAt := map[int]bool{}
	for len(poisonAt) < poison {
		poisonAt[r.IntN(n)] = true
	}
	for i := range n {
		j := job{id: fmt.Sprintf("chaos-%04d", i)}
		var steps []stepSpec
		switch {
		case poisonAt[i]:
			j.shape, j.poison = "poison", "bad"
			steps = []stepSpec{ledgerStep(r, "before"), {ID: "bad", Action: "crash", DependsOn: []string{"before"}}, ledgerStep(r, "after", "bad")}
		case r.IntN(6) == 0:
			// Priorities, concurrency keys, delays, compensation.
			j = featureJob(r, j)
			jobs = append(jobs, j)
			continue
		default:
			switch r.IntN(5) {
			case 0:
				j.shape = "chain"
				k := 3 + r.IntN(3)
				for s := range k {
					var deps []string
					if s > 0 {
						deps = []string{fmt.Sprintf("s%d", s-1)}
					}
					steps = append(steps, ledgerStep(r, fmt.Sprintf("s%d", s), deps...))
				}
			case 1:
				j.shape = "fanout"
				k := 3 + r.IntN(4)
				steps = append(steps, ledgerStep(r, "root"))
				var leaves []string
				for s := range k {
					id := fmt.Sprintf("leaf%d", s)
					leaves = append(leaves, id)
					steps = append(steps, ledgerStep(r, id, "root"))
				}
				steps = append(steps, ledgerStep(r, "join", leaves...))
			case 2:
				j.shape = "diamond"
				steps = []stepSpec{ledgerStep(r, "a"), ledgerStep(r, "b", "a"), ledgerStep(r, "c", "a"), ledgerStep(r, "d", "b", "c")}
			case 3:
				// A chain through the cluster: its leader runs every step.
				j.shape = "cluster"
				for s := range 3 {
					var deps []string
					if s > 0 {
						deps = []string{fmt.Sprintf("c%d", s-1)}
					}
					st := ledgerStep(r, fmt.Sprintf("c%d", s), deps...)
					st.Cluster = chaosCluster
					steps = append(steps, st)
				}
			default:
				j.shape = "transient"
				three := 3
				steps = []stepSpec{ledgerStep(r, "a"),
					{ID: "flaky", Action: "flaky", Params: map[string]any{"fail_attempts": 1 + r.IntN(2)}, DependsOn: []string{"a"}, MaxRetries: &three},
					ledgerStep(r, "z", "flaky")}
			}
		}
		b, _ := json.Marshal(map[string]any{"name": j.shape, "steps": steps})
		j.spec = b
		jobs = append(jobs, j)
	}
	return jobs
}

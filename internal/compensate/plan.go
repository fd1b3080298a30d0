package compensate

import (
	"errors"
	"fmt"
	"slices"
)

// Job states a compensating job moves through.
const (
	// StateCompensating: the job failed or was cancelled with compensation
	// and its compensations are running.
	StateCompensating = "compensating"
	// StateCompensated: every compensation succeeded.
	StateCompensated = "compensated"
	// StateCompensationFailed: a compensation failed for good; the ones
	// that had to wait for it were skipped.
	StateCompensationFailed = "compensation_failed"
)

// Status is what the planner needs to know of a forward step's outcome.
type Status int

// Statuses of a forward step.
const (
	// NotRun: the step never ran, or ended without success (failed,
	// skipped, cancelled, dead-lettered, expired): nothing to undo.
	NotRun Status = iota
	// InFlight: the step is dispatched and its outcome is unknown.
	InFlight
	// Succeeded: the step's work is done and may need undoing.
	Succeeded
)

// Step is one forward step of a job as the planner sees it.
type Step struct {
	ID        string
	DependsOn []string
	Status    Status
	// Compensable: the step declares a compensation.
	Compensable bool
}

// Compensation is one step of a plan.
type Compensation struct {
	// Of is the forward step this compensation undoes.
	Of string
	// After lists the forward steps whose compensations must end first
	// (the nearest compensated steps that depend on Of).
	After []string
}

// ErrUnsettled is returned while a forward step is still in flight.
var ErrUnsettled = errors.New("a step of the job is still running")

// Plan returns the compensations to run, in an order that is a valid
// serial execution (reverse dependency order, ties in spec order). The
// steps must form an acyclic graph (spec.Validate checked that). An empty
// plan means there is nothing to undo.
func Plan(steps []Step) ([]Compensation, error) {
	index := make(map[string]int, len(steps))
	for i, s := range steps {
		index[s.ID] = i
	}
	dependents := make([][]int, len(steps))
	for i, s := range steps {
		if s.Status == InFlight {
			return nil, fmt.Errorf("%w: %s", ErrUnsettled, s.ID)
		}
		for _, d := range s.DependsOn {
			k, ok := index[d]
			if !ok {
				return nil, fmt.Errorf("step %s depends on unknown step %s", s.ID, d)
			}
			dependents[k] = append(dependents[k], i)
		}
	}
	undo := func(i int) bool { return steps[i].Status == Succeeded && steps[i].Compensable }

	// after[i]: the nearest undone steps downstream of i, found by walking
	// dependents and stopping at each undone step.
	after := make([][]int, len(steps))
	for i := range steps {
		if !undo(i) {
			continue
		}
		seen := make([]bool, len(steps))
		stack := slices.Clone(dependents[i])
		for len(stack) > 0 {
			k := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if seen[k] {
				continue
			}
			seen[k] = true
			if undo(k) {
				after[i] = append(after[i], k)
				continue
			}
			stack = append(stack, dependents[k]...)
		}
		slices.Sort(after[i])
	}

	// Serial order: repeatedly take, in spec order, an undone step whose
	// downstream compensations are all placed.
	var out []Compensation
	placed := make([]bool, len(steps))
	for {
		progress := false
		for i := range steps {
			if !undo(i) || placed[i] {
				continue
			}
			ready := true
			for _, k := range after[i] {
				if !placed[k] {
					ready = false
					break
				}
			}
			if !ready {
				continue
			}
			c := Compensation{Of: steps[i].ID}
			for _, k := range after[i] {
				c.After = append(c.After, steps[k].ID)
			}
			out = append(out, c)
			placed[i] = true
			progress = true
		}
		if !progress {
			break
		}
	}
	return out, nil
}

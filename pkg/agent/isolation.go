package agent

import (
	"context"
	"strconv"
)

// isolation runs suspect tasks alone. A task is a suspect when an earlier
// run of it did not finish (a redelivery: the agent died or lost the lease
// with it in flight) or when it was taken back from a failed agent before.
// If a suspect is poison and kills the process, it takes down no innocent
// task with it, so the delivery and recovery counts that park poison steps
// do not also park their bystanders.
//
// Ordinary tasks hold one token each; a suspect takes the gate (one suspect
// at a time gathers, so two can never deadlock on half the tokens) and then
// every token, so it runs when nothing else does and nothing starts while it
// runs.
type isolation struct {
	tokens chan struct{}
	gate   chan struct{}
}

func newIsolation(n int) *isolation {
	iso := &isolation{tokens: make(chan struct{}, n), gate: make(chan struct{}, 1)}
	for range n {
		iso.tokens <- struct{}{}
	}
	return iso
}

// acquire waits for the right to run and returns its release, or nil if ctx
// ended first.
func (iso *isolation) acquire(ctx context.Context, suspect bool) func() {
	if !suspect {
		select {
		case <-iso.tokens:
			return func() { iso.tokens <- struct{}{} }
		case <-ctx.Done():
			return nil
		}
	}
	select {
	case iso.gate <- struct{}{}:
	case <-ctx.Done():
		return nil
	}
	got := 0
	release := func() {
		for range got {
			iso.tokens <- struct{}{}
		}
		<-iso.gate
	}
	for got < cap(iso.tokens) {
		select {
		case <-iso.tokens:
			got++
		case <-ctx.Done():
			release()
			return nil
		}
	}
	return release
}

// isSuspect reports whether a task should run alone.
// recoveries is the task's Warden-Recoveries header.
func isSuspect(delivery uint64, recoveries string) bool {
	if delivery > 1 {
		return true
	}
	n, _ := strconv.Atoi(recoveries)
	return n > 0
}

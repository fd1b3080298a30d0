package agent

import (
	"slices"
	"sync/atomic"
)

// taskHold is what a delivery holds while this agent has it: its dispatch
// slot and in-flight count from its arrival (pull), its isolation tokens
// once it may run. They are let go when both owners are done with them:
// process, once it has settled the delivery, and the handler's goroutine,
// if one started, once the handler returned. A handler that ignores
// cancellation is reported without after a grace (runHandler), but keeps
// its slot and tokens until it returns: let go with the report, at most
// max_concurrent tasks no longer held, a suspect no longer ran alone, and
// a redelivery of the same task ran beside it.
//
// A nil *taskHold holds nothing (Execute).
type taskHold struct {
	refs    atomic.Int32
	release []func() // called last to first by the last owner
}

// newTaskHold returns a hold owned by its caller, letting go with release.
func newTaskHold(release func()) *taskHold {
	h := &taskHold{release: []func(){release}}
	h.refs.Store(1)
	return h
}

// add adds f to what is let go. Only the first owner calls it, before it
// shares the hold.
func (h *taskHold) add(f func()) { h.release = append(h.release, f) }

// share adds an owner, which calls done in its turn.
func (h *taskHold) share() {
	if h != nil {
		h.refs.Add(1)
	}
}

// done drops an owner; the last lets everything go.
func (h *taskHold) done() {
	if h == nil || h.refs.Add(-1) != 0 {
		return
	}
	for _, f := range slices.Backward(h.release) {
		f()
	}
}

// Package testhook holds the agent runtime's test-only behaviours. Only
// package agent and its test kit (pkg/agent/agenttest) can import it, so
// none of this is part of the SDK's public API.
package testhook

import (
	"errors"

	"github.com/wardenhq/warden/pkg/protocol"
)

// ErrDrop, returned by a handler (wrapped or not) of an agent with Hooks
// installed, makes the runtime hand the task back (Nak) without reporting
// anything: what an agent that crashed mid-task does to the step, but at
// once instead of after its lease. The delivery counts towards the
// consumer's max_deliver. Without Hooks it is an ordinary failure.
var ErrDrop = errors.New("task dropped without a report")

// Hooks change what the runtime does, for tests.
type Hooks struct {
	// Presence, when set, edits every heartbeat's value before it is
	// written (e.g. to make an agent look sick to the supervisor).
	Presence func(*protocol.Presence)
	// Reported, when set, is called once a task's result is stored and
	// before its message is acked, with the task's job and step.
	Reported func(job, step string)
}

// Option returns an agent.Option (as any: this package cannot import
// agent) that installs h. Package agent sets it at init.
var Option func(h *Hooks) any

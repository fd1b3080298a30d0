// Package selection chooses the agent a step is dispatched to.
//
// Eligible agents are those of the step's pool (or the pinned agent) that
// offer the step's action, have every required capability and are not
// draining. Among them the least loaded wins, load counting the agent's last
// reported in-flight tasks plus what this scheduler assigned to it since that
// heartbeat, so a burst spreads instead of piling onto one agent. Ties go to
// the lowest id, so a choice is deterministic.
package selection

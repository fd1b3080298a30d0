// Package selection chooses the agent a step is dispatched to.
//
// Eligible agents are those of the step's pool (or the pinned agent) that
// offer the step's action, have every required capability, are not draining
// and are not excluded by their assessed health (a health factor of 0:
// critical and failed by default; an agent without assessment counts as
// healthy). Presence in the list Choose is given is what "online" means.
//
// Among them the pool's strategy decides: score (default), least_loaded,
// round_robin, affinity or standby (see Strategy). The score is
//
//	success_rate / (1 + in_flight / max_concurrent) × health factor
//
// where success_rate is the health assessment's windowed rate, or else the
// agent's lifetime counters smoothed by a prior. Ties go to the lowest id,
// so a choice is deterministic for a given state.
//
// Guarantees:
//   - Load counts the agent's last reported in_flight plus what this
//     selector assigned to it since that heartbeat, minus what finished
//     since (Release), so a burst spreads instead of piling onto one agent.
//   - This selector never brings an agent past max_concurrent by that
//     count: when every eligible agent is full, Choose returns an error
//     wrapping ErrNoAgent and ErrAtCapacity, and the step waits. The count
//     is this process's view: a heartbeat taken after an assignment but
//     before the task reached the agent, or tasks assigned by another
//     scheduler since the heartbeat, are not in it; the agent's consumer
//     (max_ack_pending = max_concurrent) is the hard bound that holds
//     regardless.
//   - ErrUnknownAction is returned only when agents of the pool are
//     present and none offers the action; every other failure wraps
//     ErrNoAgent, with a message that says why agents were excluded.
package selection

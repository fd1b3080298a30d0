// Package selection chooses the agent a step is dispatched to.
//
// Eligible agents are those of the step's pool (or the pinned agent) that
// offer the step's action, have every required capability, are not draining
// and are not excluded by their assessed health (a health factor of 0:
// critical and failed by default; an agent without assessment counts as
// healthy). An agent observed and not forgotten is what "online" means:
// presence.View.Feed gives the selector every presence the view applies,
// initial state and re-syncs included.
//
// A decision never copies or scans the fleet. The selector keeps an index
// maintained incrementally by Observe, Forget, Release and SetHealth: agents
// by key (a pinned step is one lookup) and sets per pool, per (pool, action),
// per (pool, capability) and per (pool, label), each with its members sorted
// by id and its open members (eligible, not full) apart. An untargeted step
// draws from the smallest set it needs. Sets of up to 64 agents are
// evaluated whole, so every strategy decides exactly as defined below; in
// larger sets round_robin and standby walk the set in id order (still exact)
// and score, least_loaded and affinity take the best of 8 open agents drawn
// at random (the power of d choices). No set holds the agents that offer an
// action and have every required capability; when such a step's smallest
// set is larger than 64 and the draws from it miss (the matching agents are
// rare among its open ones, or all full) or nothing of it is open, a view
// of exactly the agents matching the query (pool, action, capabilities), built by one walk of that set and
// then kept up to date like the sets, decides that step and every later
// one like it. Affinity draws from whichever of the step's set and the
// wanted labels' sets has the fewest open agents and keeps the draws that
// match the action, capabilities and labels alike; when none does, the view
// of that query (labels included) answers, so affinity turns to other
// agents only when no matching one is open. At most 64 views are kept,
// least recently used dropped. When every eligible agent is full the answer
// (ErrAtCapacity) comes from the counts of the action's set, or of the
// query's view when capabilities are required, without looking at any
// agent (the first such decision of a query may build its view, which
// later ones reuse while it is among the 64 kept); when capabilities are
// required and none is eligible, the reasons come from counts too, walking
// only the matching agents (all excluded) for their health levels.
// Capacity (the slots
// of the agents offering an action) is a running sum the sets keep. The
// exact evaluation remains the fallback that finds the precise reason an
// agent is missing.
//
// Among them the pool's strategy decides: score (default), least_loaded,
// round_robin, affinity or standby (see Strategy). round_robin keeps a turn
// per kind of step (pool, action, required capabilities; at most 1,024,
// least recently moved dropped), so one kind of step never moves another's
// turn. The score is
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
//     present and none offers the action, nor did an agent of the pool
//     that left within the last 24 hours (that step waits for it, as a
//     step waits for any offline agent); every other failure wraps
//     ErrNoAgent, with a message that says why agents were excluded.
package selection

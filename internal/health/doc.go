// Package health assesses how well an agent is doing, as pure functions of
// observed data: it reads no clock and does no I/O, so every decision takes
// `now` and is unit-tested without waiting.
//
// An Assessor turns an Observation into an Assessment: a score in [0, 1],
// the weighted mean of five components, and a Level.
//
//	component              default weight  value
//	self_reported          0.20            the agent's own health, 0..1
//	heartbeat_regularity   0.30            mean over recent heartbeat gaps of
//	                                       min(1, allowed / gap), allowed =
//	                                       interval × (1 + tolerance)
//	task_completion        0.25            succeeded / (succeeded + failed + lost)
//	resource_utilisation   0.15            1 up to utilisation_ok, falling
//	                                       linearly to 0 at full utilisation
//	error_rate             0.10            1 − failed / (succeeded + failed)
//
// A component without data (no self-report, fewer than min_tasks finished in
// the window, no heartbeat gap yet) is left out and the remaining weights are
// scaled up; with no data at all the score is 1. The score maps to healthy
// (≥ 0.9), degraded (≥ 0.7), warning (≥ 0.5), critical (≥ 0.3) or failed.
//
// Hard thresholds then cap the level, whatever the score: consecutive
// failures (3 / 10), queue depth (50 / 100) and failure rate (30% / 70%,
// once min_tasks finished) make an agent at best degraded, or at best
// unhealthy_level (critical by default: drained — no new work, in-flight work
// finishes — rather than failed over, because the agent is alive and answering;
// failed is kept for agents that stopped answering). No heartbeat for
// heartbeat_timeout makes it failed; when nothing else would, the
// assessment says so (Assessment.Silent): it is what a watcher that missed
// the heartbeats would conclude too (Assessment.Overdue says that a
// heartbeat is late at all). The score itself is not changed by the
// thresholds; Reasons say why the level is what it is.
//
// Like the rates, a streak of consecutive failures counts only while it is
// recent: once its latest failure is a window old, the agent (which, drained,
// gets no task that could end the streak with a success) is on probation,
// at best degraded instead of at best unhealthy_level, so it is undrained
// and tried again. A success ends the streak; a failure makes it recent
// again at its full length, so a still-broken agent is unhealthy again after
// one task.
//
// A Tracker is fed heartbeats (protocol.Presence, with cumulative succeeded
// and failed counters) and derives the Observation of each agent over a
// sliding window.
package health

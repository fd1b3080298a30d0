// Package schedule owns delayed and recurring jobs, built on JetStream
// message schedules (nats-server 2.12+) rather than polling loops.
//
// Delayed jobs (run_at, delay): the scheduler publishes the submission to
// warden.delay.<job> in WARDEN_DELAY with "Nats-Schedule: @at <time>" and
// target warden.delayed.<job>. The server holds it and releases it at that
// time, and a scheduler's delay relay submits it again on the job's submit
// subject, so no Warden process keeps a timer and a restart of anything
// loses nothing. See PublishDelayed and RunDelayRelay.
//
// Recurring jobs: a schedule is three subjects in WARDEN_SCHEDULES:
//   - warden.schedule.def.<name>: the definition (expression, catch-up
//     policy, grace, the job spec);
//   - warden.schedule.timer.<name>: a one-shot message schedule for the
//     next tick, carrying the tick's time in Warden-Schedule-Tick;
//   - warden.schedule.tick.<name>: where the server puts the fired tick.
//
// Every scheduler runs a Relay on one shared durable consumer of the
// ticks. For a tick due at T it submits the job <name>-<unix T> (job id and
// Nats-Msg-Id are the same on every retry, so a redelivered tick or two
// relays racing make one job) and then arms the timer for the next tick
// after max(T, now). Only then is the tick acked; a relay that dies midway
// leaves the tick to be redelivered. "Now", and so how late a tick is, is
// the NATS server's time (it fires the timers by its own clock), not the
// relay's host's. A timer is armed only while the definition it belongs
// to is still the schedule's last (the publish expects the definition's
// sequence), so a relay still handling a tick of a replaced or removed
// definition can neither replace the new definition's timer nor leave one
// behind a removed schedule; a tick of another revision is dropped, and
// arms the current definition if that has no timer.
//
// Pausing (Store.Pause, Store.Resume) is a field of the definition, so it
// is stored, read by every relay and written under the same revision
// rule (conditional on the definition read being the last). A paused
// schedule's timer keeps ticking and the relays drop its ticks, arming
// the next: ticks that fall while paused are skipped, never caught up,
// whatever the catch-up policy (which is about ticks missed while nothing
// ran). Resume arms the first tick after now. Replacing a schedule keeps
// its pause. A definition without the fields (written before pausing
// existed) is not paused. Store.Trigger submits a schedule's job once,
// outside its cadence, as <name>-t<unix ms> (TriggerID), never a tick's
// id.
//
// Both relays keep their durable consumers: one the server deleted or
// forgot is created again and consumed anew (package keep).
//
// Guarantees:
//   - at most one job per tick, whatever the number of schedulers, their
//     restarts and redeliveries (the job id is the tick);
//   - no job for a tick relayed after a pause was written, until the
//     resume (only a tick whose relaying read the definition before the
//     pause may still submit); relays of a version before pausing do not
//     know it and submit paused ticks;
//   - a tick fires while any scheduler runs: the timer is durable in the
//     stream, and a Relay arms a missing timer at start (Reconcile);
//   - ticks missed while nothing could handle them (no scheduler, or the
//     NATS server down) collapse into one overdue tick, which the catch-up
//     policy runs (run_once) or drops (skip); a tick is overdue when it is
//     handled more than its grace after it was due.
package schedule

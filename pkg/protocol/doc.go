// Package protocol is Warden's wire protocol: every subject, header and
// payload that crosses a process boundary. It is the single source of truth
// for docs/protocol.md; an agent written in another language needs nothing
// but what is defined here.
//
// Guarantees stated by the protocol:
//   - A task carries the step's epoch. A result is accepted only when its
//     epoch equals the step record's epoch; anything else is a stale result
//     and is dropped (fencing).
//   - Task and result messages carry a Nats-Msg-Id derived from
//     <job>.<step>.<epoch>, so a republish inside the stream's duplicate
//     window is stored once.
//   - An agent acknowledges a task only after the server acknowledged its
//     result (PubAck), so a task is never lost between the two.
package protocol

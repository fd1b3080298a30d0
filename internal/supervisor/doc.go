// Package supervisor runs the recovery side of Warden. Any number of
// supervisors run; they elect one leader on the "supervisor" key of the
// warden_leases bucket (package lease) and only the leader acts.
//
// A term of leadership is a few components with one duty each, wired by
// a thin leader (leader.go) and rebuilt on every takeover:
//
//   - term (term.go): the fencing epoch and the only handle that writes.
//   - recovery (recovery.go, index.go, records.go): an index of the
//     unfinished job-store records, built from record headers alone; a
//     record whose lease ends has its steps released, a pending step or a
//     stalled job that no scheduler moved is the subject of an advance
//     request.
//   - releaser (release.go): takes a step back from its agent.
//   - suspects and failover (suspects.go, failover.go): agents that left,
//     and moving a failed agent's queue.
//   - sight (sight.go): whether presence can be trusted right now.
//   - deadLetters (deadletter.go, trust.go): max-deliveries advisories and
//     the dead-letter stream.
//   - assessor and healer (health.go, healing.go): health assessment and
//     self-healing.
//   - advancer (advance.go): advance requests to the schedulers.
//
// Invariants:
//   - The supervisor never dispatches and never publishes a task. It
//     releases steps through the job store (CAS back to pending, the reason
//     in the retry chain) and asks a scheduler to advance the job; a request
//     nobody answered is asked again.
//   - Every side effect (job-store write, event, publish, message delete,
//     health record, order to an agent) checks the lease epoch first: a
//     deposed leader causes none. Events carry a Nats-Msg-Id derived from
//     what they describe, so one described twice is stored once.
//   - Cancel wins: a step whose job is being cancelled ends cancelled when
//     its lease ends or its agent fails; it is never dispatched again.
//   - "I could not see" is not "it is gone": after a gap in the presence
//     view nobody is failed over or judged by health until one presence TTL
//     has passed on a fresh view, and an agent is failed over only after a
//     direct read of its presence key finds it absent.
//   - The supervisor acts only on an agent's own task queue as its pool and
//     id derive it, never on a stream, subject or consumer a presence
//     record or an advisory names; it deletes task messages only, never
//     events, results or dead letters. A max-deliveries advisory is
//     confirmed against the consumer before anything is dead-lettered.
package supervisor

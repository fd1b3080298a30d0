// Package concurrency owns concurrency keys: at most Limit holders of a key
// at once across every scheduler, waiters served by priority, then in
// arrival order.
//
// State lives in the warden_concurrency bucket, one record per key in use,
// written only by compare-and-set, so any number of schedulers share it: a
// lost race re-reads and decides again.
//
// Guarantees:
//   - Never more than limit unexpired holders of a key (CAS on one record).
//   - A holder's slot has a lease; a holder that crashes (or a scheduler
//     that dies before releasing) loses the slot when the lease ends, so a
//     slot is never leaked. Acquire by a current holder renews its lease.
//   - Waiters are served in order: a free slot goes to the waiter of the
//     highest priority that is still asking, of those the one that
//     queued first (the record keeps each priority's waiters in the order
//     their writes landed; Since, each scheduler's clock, only
//     approximates it).
//     The order is strict: a newcomer of higher priority goes ahead of
//     every lower waiter, however long they waited, as in River's and
//     Faktory's queues; a low step waits while higher ones keep the key
//     busy (the scheduler's priority_aging ages steps waiting for agents,
//     not for a key). A waiter that stops asking (its job was cancelled,
//     its scheduler died) drops out of the queue when its wait lease ends.
//   - Release tells the caller which waiters a freed slot now belongs to,
//     in the same order, so the caller can advance their jobs at once
//     instead of waiting for their retry time.
//   - A key's queue holds at most MaxWaiters: past it a newcomer is not
//     queued, whatever its priority, and is told to ask again.
//   - A key's record is removed when it is empty (no holders, and no
//     waiters once ended leases are dropped): by the Release that empties
//     it, or by any Release that finds it so (its leases ended; written
//     by an older version). The bucket holds the keys in use, not every
//     key ever used (per-entity keys such as "customer-<id>" would grow
//     it without bound), and a process keeps no state for an idle key.
//     The removal is a purge at the record's revision, a
//     compare-and-set like every write, so an Acquire that wrote meanwhile
//     is never lost; the purge's marker expires after the bucket's
//     limit_marker_ttl, and an Acquire after a removal makes the record
//     again. A record whose last holders never release (their scheduler
//     died) stays until its key is used again. On a bucket without
//     limit_marker_ttl (made by an older version, not yet updated by
//     `warden setup`) empty records are kept, as they were.
//
// Compatibility: a record's waiters are written in the order they are
// served, a waiter's priority beside it ("priority", left out for normal).
// A version that does not know priorities reads them as normal, serves
// the waiters in the order written, so by priority too, and appends a
// newcomer at the end; its writes drop the priorities, and those waiters
// are normal from then on. Grants stay under the limit and single either
// way (every version decides on the one record, by CAS, and finds a
// waiter by its id); in a fleet of both, a Release may name a waiter the
// other version does not put first, and the slot then waits for the
// first one's next ask (at most half a wait lease).
//
// Holder ids should name the work, not the attempt (e.g. "<job>.<step>"):
// a re-dispatch of the same step then renews its own slot instead of
// queueing behind its own stale lease.
//
// Clocks: lease ends are wall-clock times written by the schedulers; keep
// their clocks in sync (NTP) or allow for skew in the leases.
package concurrency

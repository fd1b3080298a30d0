// Package concurrency owns concurrency keys: at most Limit holders of a key
// at once across every scheduler, waiters served in arrival order.
//
// State lives in the warden_concurrency bucket, one record per key, written
// only by compare-and-set, so any number of schedulers share it: a lost
// race re-reads and decides again.
//
// Guarantees:
//   - Never more than limit unexpired holders of a key (CAS on one record).
//   - A holder's slot has a lease; a holder that crashes (or a scheduler
//     that dies before releasing) loses the slot when the lease ends, so a
//     slot is never leaked. Acquire by a current holder renews its lease.
//   - Waiters are served in order: a free slot goes to the oldest waiter
//     that is still asking. A waiter that stops asking (its job was
//     cancelled, its scheduler died) drops out of the queue when its wait
//     lease ends.
//   - Release tells the caller which waiters a freed slot now belongs to,
//     so the caller can advance their jobs at once instead of waiting for
//     their retry time.
//
// Holder ids should name the work, not the attempt (e.g. "<job>.<step>"):
// a re-dispatch of the same step then renews its own slot instead of
// queueing behind its own stale lease.
//
// Clocks: lease ends are wall-clock times written by the schedulers; keep
// their clocks in sync (NTP) or allow for skew in the leases.
package concurrency

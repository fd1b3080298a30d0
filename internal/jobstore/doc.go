// Package jobstore owns the job store: job and step records in the
// warden_jobs KV bucket, and the pure state transitions applied to them.
//
// Every write is a compare-and-set on the key's revision, so any number of
// schedulers and supervisors may work on the same job: the loser of a race
// reloads and sees the winner's write. Records hold both the desired and
// the current state; a record is inconsistent while they differ, and an
// inconsistent step whose LockedUntil has passed is the supervisor's to
// recover.
//
// Listings (Store.List) read the records' headers, not their bodies, then
// only the page's records. A long-running process keeps an Index instead:
// the same listings, answered from memory, never from an index behind the
// stream (see index.go).
package jobstore

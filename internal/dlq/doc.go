// Package dlq reads and acts on the dead-letter stream WARDEN_DLQ: list,
// show, retry and purge. A dead letter is the original task message (headers
// and payload) plus Warden-DLQ-* headers saying why it was parked.
//
// Retry puts the step back to pending with a fresh attempt budget, reopens
// its job and steps skipped because of it, asks a scheduler to advance the
// job, and only then deletes the dead letter: a crash in between leaves the
// letter in place, never loses it. RetryJob (a job retry) reopens a
// finished job's failed, dead-lettered, cancelled and expired steps the
// same way, in one pass (reopen.go). A reopened step's expiry is computed
// again from the retry (a ttl runs from then, an expires_at already past
// is dropped), so a retry runs it rather than expiring it at once.
//
// Invariants: this package deletes a letter only after what it stands for
// is safely elsewhere (retry) or on an operator's explicit purge. The
// stream's own bounds drop the oldest letters too (30 days, the newest 100
// per agent, 1 GiB: streams/dlq.json); a step whose letter went stays
// dead-lettered in the job store, and a job retry runs it. A reopen never undoes a cancel: a job being cancelled is
// refused, and so is a cancelled one for a dead-letter retry
// (JobCancelledError); only a job retry, asked for the whole finished job,
// runs a cancelled job again. Every write is a compare-and-set at the
// revision its decision was read at, the job's last.
package dlq

// Package dlq reads and acts on the dead-letter stream WARDEN_DLQ: list,
// show, retry and purge. A dead letter is the original task message (headers
// and payload) plus Warden-DLQ-* headers saying why it was parked.
//
// Retry puts the step back to pending with a fresh attempt budget, reopens
// its job and steps skipped because of it, asks a scheduler to advance the
// job, and only then deletes the dead letter: a crash in between leaves the
// letter in place, never loses it.
//
// Invariants: a letter is deleted only after what it stands for is safely
// elsewhere (retry) or on an operator's explicit purge; nothing else deletes
// from WARDEN_DLQ.
package dlq

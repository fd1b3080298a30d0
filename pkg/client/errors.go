package client

import (
	"errors"
	"fmt"
)

// Errors callers branch on (with errors.Is / errors.As).
var (
	// ErrNotFound: no job with that id in the job store.
	ErrNotFound = errors.New("not found")
	// ErrRejected: the scheduler refused a submission the server had
	// accepted. A *RejectedError carries the reason.
	ErrRejected = errors.New("submission rejected")
	// ErrNoSubmitStream: nothing stores submissions; the streams have not
	// been created (no scheduler has ever started against this server).
	ErrNoSubmitStream = errors.New("no " + "WARDEN_SUBMIT stream answered")
	// ErrWatchClosed: the job store watch ended before the job did (the
	// connection closed).
	ErrWatchClosed = errors.New("job store watch closed")
	// ErrFinished: the job has already ended; there is nothing to cancel.
	ErrFinished = errors.New("job already finished")
	// ErrOutcomeUnknown: the server did not say whether it stored a
	// submission (no PubAck in time, the connection dropped, the caller's
	// context ended while it waited). An *OutcomeUnknownError carries the
	// job id the submission named.
	ErrOutcomeUnknown = errors.New("submission outcome unknown")
)

// OutcomeUnknownError is a submission the server may or may not have
// stored. Submit returns it with a Receipt naming the job (JobID, Name,
// StartsAt; no Stream or Sequence): Job (`warden job show`) finds the job
// if it was stored, once the server has answered. Submitting the same
// spec again is safe with an idempotency_key (same job id, and a repeat
// within the 2-minute window is dropped); without one it is a second job
// if the first was stored.
type OutcomeUnknownError struct {
	JobID string
	// Err is why no answer came (context.DeadlineExceeded,
	// nats.ErrConnectionClosed, ...).
	Err error
}

func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("submit job %s: the server did not say whether it stored the job: %v", e.JobID, e.Err)
}

// Is makes errors.Is(err, ErrOutcomeUnknown) true.
func (e *OutcomeUnknownError) Is(target error) bool { return target == ErrOutcomeUnknown }

// Unwrap returns why no answer came.
func (e *OutcomeUnknownError) Unwrap() error { return e.Err }

// RejectedError is the scheduler's refusal of a submission, as it replied on
// the Warden-Reply-To subject.
type RejectedError struct {
	JobID string
	// Reason is the scheduler's message, e.g. the validation error it found.
	Reason string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("job %s rejected by the scheduler: %s", e.JobID, e.Reason)
}

// Is makes errors.Is(err, ErrRejected) true.
func (e *RejectedError) Is(target error) bool { return target == ErrRejected }

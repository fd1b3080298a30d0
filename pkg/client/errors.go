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
)

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

package jobstore

import "strings"

// The reasons a scheduler writes in a pending step's Waiting field when
// the step is held back by its own gates rather than by the want of an
// agent. The scheduler writes them and reads them back (a step queued for
// a key leaves the queue when it ends unrun); the supervisor's transfer
// watch reads them (a step held back by its gates was not refused by its
// cluster). One vocabulary, so that the two cannot drift apart.
const (
	WaitingForKey       = "waiting for concurrency key" // queued in a key: "<this> <key> (limit n)"
	WaitingForRateLimit = "waiting for rate limit"      // in a limit's line: "<this> <name>"
	WaitingBehind       = "behind higher-priority work" // a higher step waits for the agent it would get
	waitingKeyError     = "concurrency key "            // a key that could not be read: "<this><key>: <error>"
	waitingLimitError   = "rate limit "                 // a limit that could not be read
)

// WaitingKeyError and WaitingLimitError are the reasons written when a
// gate could not be asked.
func WaitingKeyError(key string, err error) string { return waitingKeyError + key + ": " + err.Error() }

// WaitingLimitError: see WaitingKeyError.
func WaitingLimitError(name string, err error) string {
	return waitingLimitError + name + ": " + err.Error()
}

// WaitsForGate reports whether a Waiting reason names one of the step's
// own gates (a concurrency key, a rate limit, higher-priority work).
func WaitsForGate(waiting string) bool {
	for _, p := range []string{WaitingForKey, WaitingForRateLimit, WaitingBehind, waitingKeyError, waitingLimitError} {
		if strings.HasPrefix(waiting, p) {
			return true
		}
	}
	return false
}

// Package retry decides whether a failed step is retried.
package retry

import (
	"strings"

	"github.com/wardenhq/warden/pkg/protocol"
)

// retriablePatterns mark transient failures in an unclassified error text.
var retriablePatterns = []string{
	"timeout", "timed out", "deadline exceeded",
	"connection refused", "connection reset", "unavailable", "temporary",
	"try again", "stale heartbeat", "expired",
}

// permanentPatterns mark failures that a retry cannot fix.
var permanentPatterns = []string{
	"validation", "invalid", "permission denied", "forbidden", "unauthorized",
	"not found", "unknown action", "not allowed",
}

// Retriable classifies a failure. An explicit class from the agent wins;
// otherwise the error text is matched, permanent patterns first (so
// "invalid ... timeout" is permanent); anything else is defaultRetriable.
func Retriable(class, errText string, defaultRetriable bool) bool {
	switch class {
	case protocol.ClassRetriable:
		return true
	case protocol.ClassPermanent:
		return false
	}
	t := strings.ToLower(errText)
	for _, p := range permanentPatterns {
		if strings.Contains(t, p) {
			return false
		}
	}
	for _, p := range retriablePatterns {
		if strings.Contains(t, p) {
			return true
		}
	}
	return defaultRetriable
}

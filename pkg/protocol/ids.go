package protocol

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/nats-io/nuid"
)

// JobIDForKey derives the job id of an idempotency key, so that every
// submission with the key names the same job whoever publishes it: "job-"
// and the first 20 hex digits of SHA-256(key).
func JobIDForKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "job-" + hex.EncodeToString(sum[:10])
}

// NewJobID returns a fresh random job id for a submission without a key.
func NewJobID() string { return "job-" + nuid.Next() }

package streams

import (
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// LostCAS reports whether err is a compare-and-set the server refused
// because the subject moved on (Nats-Expected-Last-Subject-Sequence, a KV
// Create or Update at a revision): 10071, or 10164, which a replicated
// stream answers while another write of the subject is in flight. Every
// writer that reads again and decides again on a lost race asks this.
func LostCAS(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

package streams_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/streams"
)

// Both of the server's answers to a compare-and-set on a subject that
// moved on are a lost race (the rate limiter and the schedule store took
// only the first, and treated a replicated stream's 10164 as a failure).
func TestLostCAS(t *testing.T) {
	for code, want := range map[jetstream.ErrorCode]bool{
		jetstream.JSErrCodeStreamWrongLastSequence:         true,
		jetstream.JSErrCodeStreamWrongLastSequenceConstant: true,
		jetstream.JSErrCodeStreamNameInUse:                 false,
	} {
		err := fmt.Errorf("write: %w", &jetstream.APIError{ErrorCode: code})
		if got := streams.LostCAS(err); got != want {
			t.Errorf("code %d: LostCAS %v, want %v", code, got, want)
		}
	}
	if streams.LostCAS(errors.New("timeout")) {
		t.Error("a plain error is no lost race")
	}
}

package protocol_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/wardenhq/warden/pkg/protocol"
)

func TestReplyRoundTrip(t *testing.T) {
	t.Parallel()
	if d, err := protocol.ParseReply(protocol.OKReply("3 tasks moved")); err != nil || d != "3 tasks moved" {
		t.Fatalf("ok: %q %v", d, err)
	}
	// The code survives the wire and is matched by errors.Is, never by text;
	// a responder's own *ReplyError keeps its code.
	own := protocol.NewReplyError(protocol.CodeNotFound, "step j.s at epoch 3 is not running here")
	_, err := protocol.ParseReply(protocol.ErrorReply(protocol.CodeFailed, fmt.Errorf("wrapped: %w", own)))
	if !errors.Is(err, protocol.ErrNotFound) || errors.Is(err, protocol.ErrFailed) {
		t.Fatalf("want not_found, got %v", err)
	}
	_, err = protocol.ParseReply(protocol.ErrorReply(protocol.CodeFailed, errors.New("store unavailable")))
	var re *protocol.ReplyError
	if !errors.As(err, &re) || re.Code != protocol.CodeFailed || re.Message != "store unavailable" {
		t.Fatalf("want failed: store unavailable, got %v", err)
	}
	for _, bad := range []string{"ok", "error: x", "{}", ""} {
		if _, err := protocol.ParseReply([]byte(bad)); err == nil {
			t.Errorf("%q parsed as a success", bad)
		}
	}
}

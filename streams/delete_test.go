package streams_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// A message already gone is deleted without error; any other refusal is
// still an error. The raw client call reports both alike.
func TestDeleteMsgOfAMessageAlreadyGone(t *testing.T) {
	_, _, js := natstest.Start(t, streams.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := js.Publish(ctx, protocol.TaskSubject(0, "pool", "agent"), []byte("task"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, ack.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := streams.DeleteMsg(ctx, s, ack.Sequence); err != nil {
		t.Fatalf("first delete: %v", err)
	}
	if err := s.DeleteMsg(ctx, ack.Sequence); err == nil || errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("raw second delete: %v; the helper exists because nats.go reports this as ErrMsgDeleteUnsuccessful only", err)
	}
	if err := streams.DeleteMsg(ctx, s, ack.Sequence); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if err := streams.DeleteMsg(ctx, s, ack.Sequence+100); err != nil {
		t.Fatalf("delete of a sequence never stored: %v", err)
	}
	if err := js.DeleteStream(ctx, ack.Stream); err != nil {
		t.Fatal(err)
	}
	if err := streams.DeleteMsg(ctx, s, ack.Sequence); err == nil {
		t.Fatal("delete on a deleted stream reported no error")
	}
}

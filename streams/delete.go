package streams

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DeleteMsg removes message seq from stream; one already gone is not an
// error. nats.go (1.55) reports every refused delete as
// jetstream.ErrMsgDeleteUnsuccessful with the server's text, and the server
// answers "sequence not found" for a message already removed, so neither
// errors.Is(err, jetstream.ErrMsgNotFound) nor an error code tells that case
// apart: a get of the same sequence does (it reports ErrMsgNotFound by code).
func DeleteMsg(ctx context.Context, stream jetstream.Stream, seq uint64) error {
	err := stream.DeleteMsg(ctx, seq)
	if err == nil {
		return nil
	}
	_, gerr := stream.GetMsg(ctx, seq)
	if errors.Is(gerr, jetstream.ErrMsgNotFound) {
		return nil
	}
	if gerr != nil {
		return fmt.Errorf("delete message %d of %s: %w (and reading it back: %v)", seq, stream.CachedInfo().Config.Name, err, gerr)
	}
	return fmt.Errorf("delete message %d of %s: %w", seq, stream.CachedInfo().Config.Name, err)
}

// DropConsumer deletes cons, a consumer of stream made for one read (an
// ordered or ephemeral one), once the read ended or was abandoned: left,
// it stays on the server until its inactive threshold, which is the bound
// only for a delete that is lost. The delete is not cut by ctx's end (a
// read abandoned because its caller left still deletes), only by 2 s.
func DropConsumer(ctx context.Context, js jetstream.JetStream, stream string, cons jetstream.Consumer) {
	if ci := cons.CachedInfo(); ci != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = js.DeleteConsumer(dctx, stream, ci.Name)
		cancel()
	}
}

package streams_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// Each data-path work-queue stream stores its own anchor subject, and
// nothing else does.
func TestAnchorSubjectsAreStoredByTheirStream(t *testing.T) {
	opts := streams.Options{TaskShards: 2}
	names, err := streams.Anchored(opts)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{protocol.StreamSubmit, protocol.StreamResults, protocol.TaskStream(0), protocol.TaskStream(1)}
	if !slices.Equal(names, want) {
		t.Fatalf("anchored streams %v, want %v", names, want)
	}
	_, _, js := natstest.Start(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range names {
		ack, err := js.Publish(ctx, protocol.AnchorSubject(name), nil)
		if err != nil {
			t.Fatalf("anchor of %s: %v", name, err)
		}
		if ack.Stream != name {
			t.Fatalf("anchor of %s stored in %s", name, ack.Stream)
		}
	}
}

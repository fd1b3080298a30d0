package scheduler_test

import (
	"context"
	"testing"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/streams"
)

// Ending ctx while the scheduler is still starting is a shutdown, as it is
// for an agent: Run returned the startup step's "context canceled", so a
// test stopping quickly failed (CI: "scheduler: open warden_concurrency:
// context canceled") and an embedding program saw a failure.
func TestRunStoppedWhileStartingReturnsNil(t *testing.T) {
	t.Parallel()
	srv, _, _ := natstest.Start(t, streams.Options{})
	nc, _ := srv.Connect(t)
	s, err := scheduler.New(scheduler.Config{Partitions: 1}, nc, scheduler.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx); err != nil {
		t.Fatalf("Run with its context ended before it started: %v, want nil", err)
	}
}

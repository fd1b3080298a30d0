package supervisor_test

import (
	"context"
	"testing"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/streams"
)

// Ending ctx while the supervisor is still starting is a shutdown, as it is
// for an agent: Run returned the startup step's "context canceled".
func TestRunStoppedWhileStartingReturnsNil(t *testing.T) {
	t.Parallel()
	srv, _, _ := natstest.Start(t, streams.Options{})
	nc, _ := srv.Connect(t)
	v, err := supervisor.New(supervisor.Config{}, nc, testLogger(t, "supervisor"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := v.Run(ctx); err != nil {
		t.Fatalf("Run with its context ended before it started: %v, want nil", err)
	}
}

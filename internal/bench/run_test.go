package bench

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"
)

// An interrupted bench starts no further phase and says where it stopped:
// cmd/bench turns the first Ctrl-C into this context's end.
func TestRunStartsNoPhaseOnceInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep, err := Run(ctx, Config{Only: []string{"raw"}, Server: "embedded", Log: io.Discard})
	if !errors.Is(err, ErrInterrupted) {
		t.Fatalf("Run after its context ended: %v, want ErrInterrupted", err)
	}
	if rep == nil {
		t.Fatal("no report: the phases run so far are lost")
	}
	if _, ran := rep.Info["phase_raw_s"]; ran {
		t.Errorf("phase raw ran after the interrupt")
	}
	if !slices.Contains(rep.Notes, "interrupted before phase raw") {
		t.Errorf("notes %q do not say where the bench stopped", rep.Notes)
	}
}

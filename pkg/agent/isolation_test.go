package agent

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestIsolationRunsSuspectsAlone(t *testing.T) {
	t.Parallel()
	iso := newIsolation(3)
	ctx := context.Background()
	var running, maxSeen, suspectOverlap atomic.Int32
	var suspectRunning atomic.Bool
	done := make(chan struct{})
	run := func(suspect bool) {
		defer func() { done <- struct{}{} }()
		release := iso.acquire(ctx, suspect)
		n := running.Add(1)
		if suspect {
			suspectRunning.Store(true)
			if n != 1 {
				suspectOverlap.Add(1)
			}
		} else if suspectRunning.Load() {
			suspectOverlap.Add(1)
		}
		for {
			m := maxSeen.Load()
			if n <= m || maxSeen.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(2 * time.Millisecond)
		if suspect {
			suspectRunning.Store(false)
		}
		running.Add(-1)
		release()
	}
	const tasks = 60
	for i := range tasks {
		go run(i%5 == 0)
	}
	for range tasks {
		<-done
	}
	if suspectOverlap.Load() != 0 {
		t.Fatalf("a suspect ran alongside %d other tasks", suspectOverlap.Load())
	}
	if maxSeen.Load() > 3 {
		t.Fatalf("%d tasks ran at once, capacity 3", maxSeen.Load())
	}
}

func TestIsolationGivesUpWhenCancelled(t *testing.T) {
	t.Parallel()
	iso := newIsolation(2)
	hold := iso.acquire(context.Background(), false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if iso.acquire(ctx, true) != nil {
		t.Fatal("suspect acquired while a task holds a token")
	}
	hold()
	// The cancelled suspect returned what it had gathered.
	r := iso.acquire(context.Background(), true)
	if r == nil {
		t.Fatal("suspect could not acquire an idle gate")
	}
	r()
}

func TestIsSuspect(t *testing.T) {
	t.Parallel()
	if isSuspect(1, "") || isSuspect(1, "0") || !isSuspect(2, "") || !isSuspect(1, "2") {
		t.Fatal("isSuspect wrong")
	}
}

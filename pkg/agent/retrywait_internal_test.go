package agent

import (
	"context"
	"testing"
	"time"
)

// A reconnect cuts short the wait after a failed pull; a cancelled context
// ends it with false.
func TestRetryWaitEndsAtReconnect(t *testing.T) {
	a := &Agent{reconnected: make(chan struct{}, 1)}
	done := make(chan bool, 1)
	go func() { done <- a.retryWait(context.Background(), time.Hour) }()
	a.reconnected <- struct{}{}
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("retryWait reported a cancelled context")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("retryWait did not end at the reconnect")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if a.retryWait(ctx, time.Hour) {
		t.Fatal("retryWait on a cancelled context reported true")
	}
}

package agent_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
)

// A run that crashed left four deliveries unacked: a poison task and three
// bystanders. The next run fetches them one at a time: while the poison
// task runs (here it waits, as if about to crash), nothing else has been
// delivered to it, so a crash would count a delivery of the poison task
// alone. Fetched together, every bystander would share each crash's
// delivery count and reach max_deliver with it.
func TestRedeliveriesAreFetchedOneAtATime(t *testing.T) {
	t.Parallel()
	b, cfg, cons := preconsumed(t, "survivor")
	deadline := time.Now().Add(time.Hour)
	b.publish(t, protocol.Task{JobID: "job-0", StepID: "poison", Action: "poison", Deadline: deadline})
	for _, id := range []string{"job-1", "job-2", "job-3"} {
		b.publish(t, protocol.Task{JobID: id, StepID: "s", Action: "work", Deadline: deadline})
	}
	// The crashed run: all four delivered, none acked.
	batch, err := cons.Fetch(4, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range batch.Messages() {
		n++
	}
	if n != 4 {
		t.Fatalf("crashed run took %d tasks, want 4", n)
	}

	poisonRuns := make(chan struct{}, 1)
	release := make(chan struct{})
	var mu sync.Mutex
	deliveries := map[string]uint64{}
	b.start(t, cfg, func(a *agent.Agent) {
		a.Handle("poison", func(_ context.Context, task *agent.Task) (any, error) {
			poisonRuns <- struct{}{}
			<-release
			return "survived", nil
		})
		a.Handle("work", func(_ context.Context, task *agent.Task) (any, error) {
			mu.Lock()
			deliveries[task.JobID] = task.Delivery
			mu.Unlock()
			return "done", nil
		})
	})
	select {
	case <-poisonRuns:
	case <-time.After(20 * time.Second):
		t.Fatal("the poison task was not redelivered")
	}
	info := b.consumerInfo(t)
	if info.Delivered.Consumer != 5 {
		close(release)
		t.Fatalf("while the poison task runs the consumer made %d deliveries, want 5 (4 to the crashed run, then the poison task alone)",
			info.Delivered.Consumer)
	}
	mu.Lock()
	ran := len(deliveries)
	mu.Unlock()
	if ran != 0 {
		close(release)
		t.Fatalf("%d bystanders ran while the poison task did", ran)
	}
	close(release)
	natstest.Eventually(t, 30*time.Second, "the bystanders run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(deliveries) == 3
	})
	for id, d := range deliveries {
		if d != 2 {
			t.Errorf("%s ran at delivery %d, want 2", id, d)
		}
	}
}

package scheduler_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
	"github.com/wardenhq/warden/test/handagent"
)

// partitionConsumers are the names of the consumers a scheduler with
// `partitions` partitions keeps, with their streams.
func partitionConsumers(partitions int) map[string]string {
	out := map[string]string{}
	for p := range partitions {
		out[fmt.Sprintf("scheduler-submit-%d", p)] = protocol.StreamSubmit
		out[fmt.Sprintf("scheduler-results-%d", p)] = protocol.StreamResults
	}
	return out
}

// inMemory reports whether every consumer named exists with memory storage.
func inMemory(t *testing.T, js jetstream.JetStream, consumers map[string]string) bool {
	t.Helper()
	for name, stream := range consumers {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := js.Consumer(ctx, stream, name)
		cancel()
		if err != nil || !c.CachedInfo().Config.MemoryStorage {
			return false
		}
	}
	return true
}

// The partition consumers keep their state in memory, so a lone server
// that restarts forgets them. The scheduler creates them again and goes on
// taking submissions and results: a job submitted after the restart runs.
func TestPartitionConsumersComeBackAfterAServerRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	nc, js := b.srv.ConnectReconnecting(t, 20*time.Millisecond)
	b.startSchedulerOn(t, nc, scheduler.Config{})
	_, ajs := b.srv.ConnectReconnecting(t, 20*time.Millisecond)
	handagent.Start(t, ajs, "default", "a1", nil)
	consumers := partitionConsumers(scheduler.DefaultConfig().Partitions)
	natstest.Eventually(t, 10*time.Second, "partition consumers in memory", func() bool { return inMemory(t, js, consumers) })
	b.submit(t, []byte(`{"name":"before","steps":[{"id":"s","action":"echo"}]}`), "job-before", "")
	b.waitJob(t, "job-before", jobstore.JobSucceeded)

	b.srv.Down()
	b.srv.Up(t)
	natstest.Eventually(t, 10*time.Second, "clients reconnected", func() bool { return nc.IsConnected() && b.nc.IsConnected() })
	natstest.Eventually(t, 15*time.Second, "partition consumers re-created", func() bool { return inMemory(t, js, consumers) })

	for i := range 4 {
		id := fmt.Sprintf("job-after-%d", i)
		b.submit(t, []byte(`{"name":"after","steps":[{"id":"s","action":"echo"}]}`), id, "")
		b.waitJob(t, id, jobstore.JobSucceeded)
	}
}

// A partition consumer an earlier release kept on disk cannot be updated
// to memory storage: the scheduler replaces it and starts.
func TestPartitionConsumerOnDiskIsReplaced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := streams.PartitionConsumer("submit", 0, protocol.StoredSubmitFilter(0), 5*time.Second, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MemoryStorage = false
	if _, err := b.js.CreateOrUpdateConsumer(context.Background(), protocol.StreamSubmit, cfg); err != nil {
		t.Fatal(err)
	}
	b.startScheduler(t, scheduler.Config{})
	handagent.Start(t, b.js, "default", "a1", nil)
	natstest.Eventually(t, 10*time.Second, "partition consumers in memory", func() bool { return inMemory(t, b.js, partitionConsumers(scheduler.DefaultConfig().Partitions)) })
	b.submit(t, []byte(`{"name":"j","steps":[{"id":"s","action":"echo"}]}`), "job-1", "")
	b.waitJob(t, "job-1", jobstore.JobSucceeded)
}

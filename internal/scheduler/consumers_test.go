package scheduler_test

import (
	"context"
	"fmt"
	"strings"
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

// diskConsumerInUse creates partition 0's submission consumer on disk, as
// an earlier release did, and consumes it with the owner group as such a
// release's scheduler would, until the returned stop is called.
func diskConsumerInUse(t *testing.T, b *bundle) (stop func()) {
	t.Helper()
	cfg, err := streams.PartitionConsumer("submit", 0, protocol.StoredSubmitFilter(0), 5*time.Second, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MemoryStorage = false
	cons, err := b.js.CreateOrUpdateConsumer(context.Background(), protocol.StreamSubmit, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(jetstream.Msg) {}, jetstream.PullPriorityGroup(streams.PriorityGroupOwner), jetstream.PullExpiry(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "old consumer pulled", func() bool {
		c, err := b.js.Consumer(context.Background(), protocol.StreamSubmit, cfg.Durable)
		return err == nil && c.CachedInfo().NumWaiting > 0
	})
	t.Cleanup(cc.Stop)
	return cc.Stop
}

// A consumer on disk that a scheduler of the earlier release still uses is
// not taken from it: the new scheduler waits, and refuses to start, naming
// what to do.
func TestPartitionConsumerOnDiskInUseIsNotTaken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	diskConsumerInUse(t, b)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	nc, _ := b.srv.Connect(t)
	select {
	case err := <-runScheduler(ctx, t, nc, scheduler.Config{}):
		if err == nil || !strings.Contains(err.Error(), "earlier release") {
			t.Fatalf("Run returned %v, want the consumer in use named", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the scheduler neither started nor refused")
	}
	c, err := b.js.Consumer(context.Background(), protocol.StreamSubmit, "scheduler-submit-0")
	if err != nil || c.CachedInfo().Config.MemoryStorage {
		t.Fatalf("the consumer in use was replaced: %v", err)
	}
}

// Once the earlier release's scheduler stops, the new one replaces its
// consumer and runs jobs: the upgrade of a stopped-then-started deployment.
func TestPartitionConsumerOnDiskIsReplacedOnceReleased(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stop := diskConsumerInUse(t, b)
	time.AfterFunc(time.Second, stop)
	b.startScheduler(t, scheduler.Config{})
	handagent.Start(t, b.js, "default", "a1", nil)
	natstest.Eventually(t, 20*time.Second, "partition consumers in memory", func() bool {
		return inMemory(t, b.js, partitionConsumers(scheduler.DefaultConfig().Partitions))
	})
	b.submit(t, []byte(`{"name":"j","steps":[{"id":"s","action":"echo"}]}`), "job-1", "")
	b.waitJob(t, "job-1", jobstore.JobSucceeded)
}

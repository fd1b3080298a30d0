package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// TestDrainedAgentsQueueDepthFollowsItsConsumer: a drained agent does not
// pull, so its queue_depth used to stay what its last pull saw. An agent
// that came back to a long queue reported it, was assessed critical
// (queue depth ≥ 100) and drained; the healer then moved its queue away,
// but the agent reported the old depth, stayed critical, and stayed
// drained for good. Held back, it now reads its consumer's pending count
// at most once a heartbeat interval: whether a drain finds every slot
// busy (the dispatcher waits for a slot) or the slots free (it loops, held
// back), the depth follows the queue, up and down.
func TestDrainedAgentsQueueDepthFollowsItsConsumer(t *testing.T) {
	t.Parallel()
	s, nc, js := natstest.Start(t, streams.Options{TaskShards: testShards, PresenceTTL: time.Second})
	shard := protocol.Shard("p", "a1", testShards)
	subject := protocol.TaskSubject(shard, "p", "a1")
	queue := func(first, n int) (seqs []uint64) {
		t.Helper()
		for i := first; i < first+n; i++ {
			body, _ := json.Marshal(protocol.Task{JobID: fmt.Sprintf("j%d", i), StepID: "s", Epoch: 1, Attempt: 1, Action: "block",
				Deadline: time.Now().Add(30 * time.Second)})
			ack, err := js.Publish(context.Background(), subject, body)
			if err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, ack.Sequence)
		}
		return seqs
	}
	stream, err := js.Stream(context.Background(), protocol.TaskStream(shard))
	if err != nil {
		t.Fatal(err)
	}
	// remove deletes queued tasks one by one, as the supervisor's transfer
	// does (internal/supervisor, drainQueue).
	remove := func(seqs []uint64) {
		t.Helper()
		for _, seq := range seqs {
			if err := stream.DeleteMsg(context.Background(), seq); err != nil {
				t.Fatalf("delete task %d: %v", seq, err)
			}
		}
	}
	// j0 runs (max_concurrent 1) and blocks; three wait behind it.
	first := queue(0, 4)
	cfg := testConfig("a1")
	cfg.MaxConcurrent = 1
	long := newBlocker()
	b := &bundle{srv: s, nc: nc, js: js}
	b.start(t, cfg, func(a *agent.Agent) { a.Handle("block", long.handle) })
	defer long.free()
	long.waitStarted(t)
	// reports waits for a heartbeat with queue depth want, drained or not.
	reports := func(want int, drained bool, why string) {
		t.Helper()
		natstest.Eventually(t, 5*time.Second, why, func() bool {
			p, err := b.presence(t)
			return err == nil && p.QueueDepth == want && p.Draining == drained
		})
	}
	reports(3, false, "three tasks waiting reported")

	// Drained while its only slot is busy: the queue moves away.
	if r := b.control(t, protocol.Control{Op: protocol.ControlDrain}); !r.OK {
		t.Fatalf("drain: %+v", r)
	}
	remove(first[1:])
	reports(0, true, "queue depth 0 once the queue is gone, every slot busy")

	// Tasks queued while drained are reported too.
	second := queue(10, 2)
	reports(2, true, "the tasks queued while drained reported")

	// Its slot free, the agent loops held back: the queue moves away again.
	long.free()
	if r, _ := b.result(t, "j0", "s"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("in-flight task: %+v", r)
	}
	natstest.Eventually(t, 10*time.Second, "the in-flight task acked", func() bool { return b.consumerInfo(t).NumAckPending == 0 })
	reports(2, true, "the queue still reported, held back with a free slot")
	remove(second)
	reports(0, true, "queue depth 0 once the queue is gone, held back with a free slot")
	if got := b.consumerInfo(t); got.NumPending != 0 || got.NumAckPending != 0 {
		t.Fatalf("the drained agent took tasks: %+v", got)
	}
}

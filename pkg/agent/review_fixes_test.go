package agent_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/protocol"
)

// A suspect (a dispatch taken back from an agent before) waits to run
// alone; one whose deadline passes while a long handler holds a slot is
// reported as a handler that could not start. Its lease keeper stops at
// the deadline, so it lost its lease, was handed back unreported, was
// dead-lettered unrun as expired at its redelivery, and the lost lease
// counted as one more recovery (poison after three) of a step that never
// ran.
//
// Old code: no result within the wait.
func TestSuspectWaitingPastItsDeadlineIsReported(t *testing.T) {
	t.Parallel()
	b, long, ran := busyAgent(t, 2, "victim")
	defer long.free()
	m := b.taskMsg(t, protocol.Task{JobID: "j2", StepID: "s", Action: "victim", Deadline: time.Now().Add(3 * time.Second)})
	m.Header.Set(protocol.HeaderRecoveries, "1")
	if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	r, _ := b.result(t, "j2", "s")
	if r.Status != protocol.ResultFailed || !strings.Contains(r.Error, agent.ErrDeadline.Error()) || ran.Load() != 0 {
		t.Fatalf("result %s %q, handler runs %d; want failed (%v), not run", r.Status, r.Error, ran.Load(), agent.ErrDeadline)
	}
}

// A cancel order for a dispatch still queued here (behind a long task) is
// kept, and the dispatch is reported cancelled unrun when it arrives. It
// was answered not_found and forgotten; the scheduler sends it once, and
// the task of a cancelled job ran in full when it was pulled.
//
// Old code: "the queued task of a cancelled step ran 1 times".
func TestCancelOfAQueuedDispatchHoldsWhenItArrives(t *testing.T) {
	t.Parallel()
	b, long, ran := busyAgent(t, 1, "victim")
	defer long.free()
	b.publish(t, protocol.Task{JobID: "j2", StepID: "s", Action: "victim"})
	if rep := b.control(t, protocol.Control{Op: protocol.ControlCancel, JobID: "j2", StepID: "s", Epoch: 1}); rep.OK {
		t.Fatalf("cancel of a dispatch not running here answered %+v, want not_found", rep)
	}
	long.free()
	r, _ := b.result(t, "j2", "s")
	if n := ran.Load(); n != 0 {
		t.Fatalf("the queued task of a cancelled step ran %d times", n)
	}
	if r.Status != protocol.ResultFailed || !strings.Contains(r.Error, protocol.ErrorCancelled) {
		t.Fatalf("result %s %q, want failed, cancelled", r.Status, r.Error)
	}
}

// A lone server that restarts while the agent drains (stopping, a task
// still running) forgets the task consumer; the agent creates it again,
// as it does outside a drain, so that the running task keeps its lease
// and reports. The restore stopped with the fetching, before the drain:
// the lease extensions found no responder, and the task was abandoned
// unreported when it was about to finish.
//
// Old code: "timed out after 10s: the task consumer created again".
func TestServerRestartDuringTheDrainKeepsTheRunningTask(t *testing.T) {
	t.Parallel()
	cfg := testConfig("a1")
	cfg.Lease = protocol.Duration(900 * time.Millisecond)
	cfg.DrainTimeout = protocol.Duration(30 * time.Second)
	b := startHolding(t, cfg)
	b.publish(t, protocol.Task{JobID: "drained", StepID: "s", Action: "hold"})
	b.waitStarted(t)
	b.cancel() // stop: the agent drains
	kv, err := b.js.KeyValue(context.Background(), protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, "the agent draining", func() bool {
		e, err := kv.Get(context.Background(), protocol.PresenceKey("p", "a1"))
		if err != nil {
			return false
		}
		var p protocol.Presence
		return json.Unmarshal(e.Value(), &p) == nil && p.Draining
	})
	b.restartServer(t)
	natstest.Eventually(t, 10*time.Second, "the task consumer created again", func() bool {
		_, err := b.js.Consumer(context.Background(), protocol.TaskStream(protocol.Shard("p", "a1", testShards)), "a1")
		return err == nil
	})
	close(b.release)
	if r, _ := b.result(t, "drained", "s"); r.Status != protocol.ResultSucceeded {
		t.Fatalf("result %+v, want succeeded", r)
	}
}

// A kept cancel that names a dispatch's lease token matches that dispatch
// only: a job submitted again with the same id after its records expired
// dispatches its steps at epoch 1 again, with new tokens, and the old
// dispatch's cancel must not end the new one unrun.
func TestKeptCancelOfAnotherDispatchDoesNotCancel(t *testing.T) {
	t.Parallel()
	b, long, ran := busyAgent(t, 1, "victim")
	defer long.free()
	b.publish(t, protocol.Task{JobID: "j2", StepID: "s", Action: "victim", Token: "new-token"})
	if rep := b.control(t, protocol.Control{Op: protocol.ControlCancel, JobID: "j2", StepID: "s", Epoch: 1, Token: "old-token"}); rep.OK {
		t.Fatalf("cancel of a dispatch not running here answered %+v, want not_found", rep)
	}
	long.free()
	r, _ := b.result(t, "j2", "s")
	if r.Status != protocol.ResultSucceeded || ran.Load() != 1 {
		t.Fatalf("result %s %q, handler runs %d; want the new dispatch run", r.Status, r.Error, ran.Load())
	}
}

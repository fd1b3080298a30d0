package supervisor

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// transferBundle is a term's transfer watch on a test server, fed by the
// term's failover.
type transferBundle struct {
	*parts
	x *transfers
}

func newTransferBundle(t *testing.T) *transferBundle {
	t.Helper()
	p := newParts(t)
	x := newTransfers(p.term, p.js, p.store, p.rel, p.rel.dead, p.adv, NewMetrics(nil), streams.DefaultTaskShards, time.Second, p.rel.log)
	p.fo.transfers = x
	return &transferBundle{parts: p, x: x}
}

// moved dispatches job's step (a step of cluster c1, at most 3 retries)
// to agent a0 with its task in hand, fails a0 over and returns the watch
// the failover started, its timeout passed.
func (b *transferBundle) moved(t *testing.T, job string) *transferWatch {
	t.Helper()
	ctx := context.Background()
	queue, seq := b.dispatched(t, job, "a0")
	// Its task as a cluster's: the failover notes it for the watch.
	if err := queue.DeleteMsg(ctx, seq); err != nil {
		t.Fatal(err)
	}
	q, _ := agentQueue("default", "a0", streams.DefaultTaskShards)
	m := nats.NewMsg(q.subject)
	m.Header.Set(protocol.HeaderJob, job)
	m.Header.Set(protocol.HeaderStep, "s")
	m.Header.Set(protocol.HeaderEpoch, "1")
	m.Header.Set(protocol.HeaderCluster, "c1")
	if _, err := b.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	b.consume(t, "a0", 5, 1) // in a0's hands
	b.changeStep(t, job, func(st *jobstore.Step) error {
		st.Cluster, st.MaxRetries = "c1", 3
		return nil
	})
	if _, err := b.fo.transfer(ctx, "default", "a0", "departed:"+job); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-b.x.notes:
		policy := cluster.TransferPolicy{Timeout: time.Minute, MaxRetries: 1}
		n.at = time.Now().Add(-policy.Timeout)
		return &transferWatch{transferNote: n, policy: policy, due: n.at.Add(policy.Timeout)}
	default:
		t.Fatalf("%s: the failover noted no transfer", job)
		return nil
	}
}

// judgeAll judges w once more than its policy allows retries and fails t
// if the step was dead-lettered or a retry was spent; it returns whether
// the step is still watched.
func (b *transferBundle) judgeAll(t *testing.T, w *transferWatch, what string) (keep bool) {
	t.Helper()
	for i := range w.policy.MaxRetries + 1 {
		var err error
		if keep, err = b.x.judge(context.Background(), w); err != nil {
			t.Fatalf("%s: judgement %d: %v", what, i+1, err)
		}
		st, _, err := b.store.Step(context.Background(), w.job, w.step)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == jobstore.StepDeadLettered || w.retries != 0 {
			t.Fatalf("%s: after judgement %d: step %s (%s), %d transfer retries; want neither dead-lettered nor moved again",
				what, i+1, st.State, st.LastError, w.retries)
		}
		if !keep {
			break
		}
	}
	if n := b.msgs(t, protocol.StreamDLQ); n != 0 {
		t.Fatalf("%s: %d dead letters", what, n)
	}
	return keep
}

// A transfer's judgement looked only at the step as it was then: a
// pending step counted as not taken up whatever held it. A step the
// cluster took up, whose member failed it retriably with a backoff
// (agent.RetryAfter), was pending at each check, moved again and again
// (cluster_transfer_retry) and then dead-lettered as transfer_timeout:
// the job failed although the cluster ran the step. A step held back by
// its own gates (a concurrency key, a rate limit), or sent to a member
// busy with as many tasks as it takes, met the same fate. Now a result
// after the move counts as taken up, and waits that are not the cluster's
// restart the clock without spending a retry.
//
// Old code: "taken up, then backing off: after judgement 1: step pending
// (...), 1 transfer retries ...", likewise "backoff without a result",
// "concurrency key" and "member at its max_ack_pending".
func TestTransferTakenUpOrHeldBackIsNotGivenUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("taken up, then backing off", func(t *testing.T) {
		t.Parallel()
		b := newTransferBundle(t)
		w := b.moved(t, "job-r")
		// Routed to member b1, which took it up and failed it: retry in an hour.
		b.changeStep(t, "job-r", func(st *jobstore.Step) error {
			now := time.Now().UTC()
			if err := st.Dispatch("b1", protocol.NewLeaseToken(), now, time.Minute); err != nil {
				return err
			}
			if _, err := st.ApplyResult(protocol.Result{JobID: "job-r", StepID: "s", Epoch: st.Epoch, Token: st.Token, Agent: "b1",
				Status: protocol.ResultFailed, Error: "busy", ErrorClass: protocol.ClassRetriable}, true, now); err != nil {
				return err
			}
			st.Attempts[len(st.Attempts)-1].Class = protocol.ClassRetriable
			st.NotBefore = now.Add(time.Hour)
			return nil
		})
		if keep := b.judgeAll(t, w, "taken up, then backing off"); keep {
			t.Fatal("a step a member reported on is still watched")
		}
	})

	t.Run("backoff without a result", func(t *testing.T) {
		t.Parallel()
		b := newTransferBundle(t)
		w := b.moved(t, "job-n")
		b.changeStep(t, "job-n", func(st *jobstore.Step) error {
			st.NotBefore = time.Now().Add(time.Hour)
			return nil
		})
		if keep := b.judgeAll(t, w, "backoff without a result"); !keep {
			t.Fatal("a step held back by its backoff is no longer watched")
		}
		if !w.due.After(time.Now().Add(w.policy.Timeout / 2)) {
			t.Errorf("judged again at %s, want a timeout from now", w.due)
		}
	})

	t.Run("concurrency key", func(t *testing.T) {
		t.Parallel()
		b := newTransferBundle(t)
		w := b.moved(t, "job-k")
		b.changeStep(t, "job-k", func(st *jobstore.Step) error {
			st.Waiting = "waiting for concurrency key k (limit 1)"
			return nil
		})
		b.judgeAll(t, w, "concurrency key")
	})

	t.Run("member at its max_ack_pending", func(t *testing.T) {
		t.Parallel()
		b := newTransferBundle(t)
		w := b.moved(t, "job-f")
		// Member b2 has one task in hand, all its consumer allows; the
		// moved step's task waits behind it.
		b.queueTask(t, "job-other", "b2", 1)
		q, _ := agentQueue("default", "b2", streams.DefaultTaskShards)
		cc, err := streams.TaskConsumer(q.shard, q.pool, q.agent, time.Minute, 5, 1)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := b.js.CreateOrUpdateConsumer(ctx, q.stream, cc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		b.changeStep(t, "job-f", func(st *jobstore.Step) error {
			return st.Dispatch("b2", protocol.NewLeaseToken(), time.Now().UTC(), time.Minute)
		})
		b.queueTask(t, "job-f", "b2", 2)
		b.judgeAll(t, w, "member at its max_ack_pending")
	})

	// What the cluster does not take up is still moved again, then given up.
	t.Run("no member", func(t *testing.T) {
		t.Parallel()
		b := newTransferBundle(t)
		w := b.moved(t, "job-x")
		b.changeStep(t, "job-x", func(st *jobstore.Step) error {
			st.Waiting = "cluster c1: no member can take it: cluster: no member can take the step now"
			return nil
		})
		for i := range w.policy.MaxRetries + 1 {
			if _, err := b.x.judge(ctx, w); err != nil {
				t.Fatalf("judgement %d: %v", i+1, err)
			}
		}
		st, _, err := b.store.Step(ctx, "job-x", "s")
		if err != nil || st.State != jobstore.StepDeadLettered || w.retries != w.policy.MaxRetries {
			t.Fatalf("step nobody could take: %+v %v after %d retries; want dead-lettered after %d", st, err, w.retries, w.policy.MaxRetries)
		}
	})
}

// The give-up re-read the step but parked whatever it found: a step
// dispatched again between the judgement and the give-up's CAS (its park
// lost the race and read again) was dead-lettered for what the earlier
// dispatch had not done. It is bound to the dispatch judged now: the step
// is judged again instead, and the letter of the lost park withdrawn.
//
// Old code: "re-dispatched under the give-up: step dead_lettered at epoch
// 2, 1 dead letters; want dispatched at epoch 2, none".
func TestTransferGiveUpBoundToTheDispatchJudged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newTransferBundle(t)
	b.dispatched(t, "job-g", "a3") // epoch 1, never delivered: not taken up
	w := &transferWatch{transferNote: transferNote{job: "job-g", step: "s", cluster: "c1", from: "default.a0"},
		policy: cluster.TransferPolicy{Timeout: time.Second, MaxRetries: 1}, retries: 1}
	var fired atomic.Bool
	b.hooked().hook = func() bool {
		if fired.Load() || !inStepWrite() {
			return false
		}
		fired.Store(true)
		// The park is about to mark the step: a scheduler routed it again
		// meanwhile (a refusal, say, then a new dispatch).
		b.changeStep(t, "job-g", func(st *jobstore.Step) error {
			if err := st.Release(statusTransferred, "refused", false, time.Now().UTC()); err != nil {
				return err
			}
			return st.Dispatch("b3", protocol.NewLeaseToken(), time.Now().UTC(), time.Minute)
		})
		return false
	}
	keep, err := b.x.judge(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	st, _, err := b.store.Step(ctx, "job-g", "s")
	if err != nil {
		t.Fatal(err)
	}
	n := b.msgs(t, protocol.StreamDLQ)
	if !fired.Load() {
		t.Fatal("the step was never dispatched again under the give-up")
	}
	if st.State != jobstore.StepDispatched || st.Epoch != 2 || n != 0 {
		t.Fatalf("re-dispatched under the give-up: step %s at epoch %d, %d dead letters; want dispatched at epoch 2, none", st.State, st.Epoch, n)
	}
	if !keep {
		t.Fatal("the step dispatched again is no longer watched")
	}
}

// A give-up on a job being cancelled ends the step cancelled, and its task
// goes from the member's queue as every other give-up's does: left there,
// a member back before the task's deadline ran it after its job had ended
// cancelled.
//
// Old code: the task was still queued.
func TestTransferGiveUpOfACancelledJobDropsItsTask(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newTransferBundle(t)
	queue, seq := b.dispatched(t, "job-gc", "a3") // epoch 1, never delivered: not taken up
	j, rev, err := b.store.Job(ctx, "job-gc")
	if err != nil {
		t.Fatal(err)
	}
	j.Desired = jobstore.JobCancelled
	if _, err := b.store.UpdateJob(ctx, j, rev); err != nil {
		t.Fatal(err)
	}
	w := &transferWatch{transferNote: transferNote{job: "job-gc", step: "s", cluster: "c1", from: "default.a0"},
		policy: cluster.TransferPolicy{Timeout: time.Second, MaxRetries: 1}, retries: 1}
	if _, err := b.x.judge(ctx, w); err != nil {
		t.Fatal(err)
	}
	st, _, err := b.store.Step(ctx, "job-gc", "s")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != jobstore.StepCancelled {
		t.Fatalf("step %s (%s), want cancelled", st.State, st.LastError)
	}
	if !taskGone(t, queue, seq) {
		t.Fatal("the cancelled step's task is still in its member's queue")
	}
}

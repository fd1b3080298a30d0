package supervisor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/pkg/protocol"
)

// transferNote is one cluster step the failover moved off a member.
type transferNote struct {
	job, step, cluster, from string
	// epoch is the dispatch moved (its task's epoch): only what happens
	// to the step after it, a dispatch with a higher epoch, is judged.
	epoch uint64
	at    time.Time
}

// transferWatch is a moved step awaiting its verdict.
type transferWatch struct {
	transferNote
	policy  cluster.TransferPolicy
	retries int
	due     time.Time
	// judged is the step as the last judgement found it not taken up:
	// a give-up parks it only as long as it is still so.
	judged judgement
}

// judgement is the state and epoch of a step judged not taken up.
type judgement struct {
	state jobstore.StepState
	epoch uint64
}

// errMovedOn: the step changed between its judgement and its give-up; it
// is judged again.
var errMovedOn = errors.New("transferred step moved on since it was judged")

// transfers enforces the cluster failover policy on the steps failover
// moves off a failed cluster member (task_transfer_timeout,
// max_transfer_retries; docs/clusters.md "Task transfer"): a moved step
// that no member has taken up within the timeout (no dispatch after the
// move delivered or reported on: see judge) is moved again, the member
// that sat on it being avoided where the mode allows a choice; after
// max_transfer_retries it is dead-lettered (transfer_timeout). A step held
// back by something other than the cluster is given another timeout. What it watches lives in this term's memory: after a
// supervisor failover a moved step is bounded by its own lease again.
type transfers struct {
	js      jetstream.JetStream
	term    *term
	store   *jobstore.Store
	release *releaser
	dead    *deadLetters
	adv     *advancer
	metrics *Metrics
	shards  int
	retry   time.Duration
	log     zerolog.Logger

	notes    chan transferNote
	clusters *cluster.Store // opened on first use
}

func newTransfers(t *term, js jetstream.JetStream, store *jobstore.Store, rel *releaser, dead *deadLetters, adv *advancer,
	m *Metrics, shards int, retry time.Duration, log zerolog.Logger) *transfers {
	return &transfers{js: js, term: t, store: store, release: rel, dead: dead, adv: adv, metrics: m, shards: shards,
		retry: retry, log: log, notes: make(chan transferNote, 1024)}
}

// note hands a moved cluster step to the watch; never blocks.
func (x *transfers) note(n transferNote) {
	if x == nil {
		return
	}
	select {
	case x.notes <- n:
	default:
		x.log.Error().Str(logging.FieldJob, n.job).Str(logging.FieldStep, n.step).
			Msg("transfer not watched: queue full; the step's lease bounds it instead")
	}
}

// run judges each moved step when its timeout has passed, until ctx ends
// or the lease is lost.
func (x *transfers) run(ctx context.Context) error {
	watching := map[string]*transferWatch{}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case n := <-x.notes:
			x.watch(ctx, watching, n)
		case <-timer.C:
		}
		now := x.term.now()
		next := now.Add(time.Hour)
		for key, w := range watching {
			if now.Before(w.due) {
				next = minTime(next, w.due)
				continue
			}
			keep, err := x.judge(ctx, w)
			switch {
			case ctx.Err() != nil:
				return nil
			case err != nil:
				x.log.Warn().Err(err).Str(logging.FieldJob, w.job).Str(logging.FieldStep, w.step).Msg("transfer check deferred")
				w.due, keep = now.Add(x.retry), true
			}
			if !keep {
				delete(watching, key)
				continue
			}
			next = minTime(next, w.due)
		}
		timer.Reset(max(next.Sub(x.term.now()), time.Millisecond))
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// watch starts (or, for a step moved again by a new failover, restarts
// the clock of) the watch of a moved step. The retries already spent on
// the step carry over: they bound the step, not one member's failure.
func (x *transfers) watch(ctx context.Context, watching map[string]*transferWatch, n transferNote) {
	key := n.job + "." + n.step
	if w, ok := watching[key]; ok {
		w.from, w.epoch, w.at, w.due = n.from, n.epoch, n.at, n.at.Add(w.policy.Timeout)
		return
	}
	p, err := x.policy(ctx, n.cluster)
	if err != nil {
		x.log.Warn().Err(err).Str("cluster", n.cluster).Str(logging.FieldJob, n.job).
			Msg("transfer not watched: no cluster definition; the step's lease bounds it instead")
		return
	}
	watching[key] = &transferWatch{transferNote: n, policy: p, due: n.at.Add(p.Timeout)}
}

func (x *transfers) policy(ctx context.Context, name string) (cluster.TransferPolicy, error) {
	if x.clusters == nil {
		s, err := cluster.Open(ctx, x.js)
		if err != nil {
			return cluster.TransferPolicy{}, err
		}
		x.clusters = s
	}
	d, _, err := x.clusters.Get(ctx, name)
	if err != nil {
		return cluster.TransferPolicy{}, fmt.Errorf("cluster %s: %w", name, err)
	}
	return cluster.TransferPolicyOf(d), nil
}

// judge decides one moved step whose timeout has passed; keep says it is
// still watched (moved again, held back, or changed under a give-up: due
// again later).
//
// Only the dispatches after the move count (epochs above w.epoch): the
// step was taken up if one of them was delivered to its member or a
// member reported a result for one (a failure to be retried after a
// backoff too: the cluster ran it). A refusal (class reroute) is no
// result: the member did not take it. A step that waits for something
// other than a member (see heldBack) is not judged: the clock starts
// again, no retry is spent.
func (x *transfers) judge(ctx context.Context, w *transferWatch) (keep bool, err error) {
	if err := x.term.fence(); err != nil {
		return false, err
	}
	st, _, err := x.store.Step(ctx, w.job, w.step)
	if errors.Is(err, jobstore.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if st.State != jobstore.StepPending && st.State != jobstore.StepDispatched {
		return false, nil // it ended meanwhile
	}
	now := x.term.now()
	if a := resultAfter(st, w.epoch); a != nil {
		x.log.Info().Str(logging.FieldJob, w.job).Str(logging.FieldStep, w.step).Str("member", st.Pool+"."+a.Agent).
			Uint64(logging.FieldEpoch, a.Epoch).Str("result", a.Status).Int("retries", w.retries).Msg("transferred step taken up: a member reported on it")
		return false, nil
	}
	var raw *jetstream.RawStreamMsg
	member, takenUp, held := "", false, ""
	switch st.State {
	case jobstore.StepPending:
		// Waiting for a member, all along or since a refusal: not taken up,
		// unless something else holds it back.
		held = heldBack(st, now)
	case jobstore.StepDispatched:
		member = st.Pool + "." + st.Actor
		if raw, takenUp, held, err = x.takenUp(ctx, st); err != nil {
			return false, err
		}
	}
	if held != "" && !takenUp {
		w.at, w.due = now, now.Add(w.policy.Timeout)
		x.log.Info().Str(logging.FieldJob, w.job).Str(logging.FieldStep, w.step).Str("held_by", held).
			Int("retries", w.retries).Msg("transferred step held back by something other than the cluster: judged again after another timeout")
		return true, nil
	}
	switch cluster.JudgeTransfer(takenUp, w.retries, w.policy) {
	case cluster.TransferDone:
		x.log.Info().Str(logging.FieldJob, w.job).Str(logging.FieldStep, w.step).Str("member", member).
			Int("retries", w.retries).Msg("transferred step taken up")
		return false, nil
	case cluster.TransferRetry:
		return true, x.retryTransfer(ctx, w, st, member, raw)
	default:
		w.judged = judgement{state: st.State, epoch: st.Epoch}
		err := x.giveUp(ctx, w, member, raw)
		if errors.Is(err, errMovedOn) {
			w.due = x.term.now().Add(x.retry)
			return true, nil
		}
		return false, err
	}
}

// resultAfter returns the latest attempt of a dispatch after epoch moved
// that a member reported on (succeeded, or failed other than by refusing
// it), or nil.
func resultAfter(st *jobstore.Step, moved uint64) *jobstore.Attempt {
	for i := len(st.Attempts) - 1; i >= 0; i-- {
		a := &st.Attempts[i]
		if a.Epoch <= moved {
			break
		}
		if (a.Status == protocol.ResultSucceeded || a.Status == protocol.ResultFailed) && a.Class != protocol.ClassReroute {
			return a
		}
	}
	return nil
}

// heldBack says what holds a pending step back other than the cluster's
// want of a member (empty: nothing): a backoff (not a refusal's short
// one), or one of its own gates.
func heldBack(st *jobstore.Step, now time.Time) string {
	if st.NotBefore.After(now) {
		n := len(st.Attempts)
		if n == 0 || st.Attempts[n-1].Epoch != st.Epoch || st.Attempts[n-1].Class != protocol.ClassReroute {
			return "backoff until " + st.NotBefore.UTC().Format(time.RFC3339)
		}
	}
	if jobstore.WaitsForGate(st.Waiting) {
		return st.Waiting // its own gate, not the cluster's want of a member
	}
	return ""
}

// takenUp finds the step's task in its member's queue and reports whether
// the member's consumer has delivered it. A task no longer in the queue
// was acked or terminated by the member: it had it. held is set when it
// was not delivered because the member has as many tasks in hand as its
// consumer allows (max_ack_pending): the member works, and the leases of
// the tasks in its hands bound the wait.
func (x *transfers) takenUp(ctx context.Context, st *jobstore.Step) (raw *jetstream.RawStreamMsg, up bool, held string, err error) {
	q, ok := agentQueue(st.Pool, st.Actor, x.shards)
	if !ok {
		return nil, true, "", nil // not a queue we may judge; the lease bounds it
	}
	stream, err := x.js.Stream(ctx, q.stream)
	if err != nil {
		return nil, false, "", fmt.Errorf("task stream %s: %w", q.stream, err)
	}
	for seq := uint64(1); raw == nil; {
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(q.subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, true, "", nil
		}
		if err != nil {
			return nil, false, "", fmt.Errorf("read queue of %s: %w", q.agent, err)
		}
		seq = m.Sequence + 1
		epoch, _ := strconv.ParseUint(m.Header.Get(protocol.HeaderEpoch), 10, 64)
		if m.Header.Get(protocol.HeaderJob) == st.JobID && m.Header.Get(protocol.HeaderStep) == st.ID && epoch == st.Epoch {
			raw = m
		}
	}
	cons, err := stream.Consumer(ctx, q.consumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return raw, false, "", nil // the member never even asked for work
	}
	if err != nil {
		return nil, false, "", fmt.Errorf("consumer of %s: %w", q.agent, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, false, "", fmt.Errorf("consumer of %s: %w", q.agent, err)
	}
	if info.Delivered.Stream >= raw.Sequence {
		return raw, true, "", nil
	}
	if limit := info.Config.MaxAckPending; limit > 0 && info.NumAckPending >= limit {
		held = fmt.Sprintf("member %s has %d tasks in hand, its max_ack_pending", q.pool+"."+q.agent, info.NumAckPending)
	}
	return raw, false, held, nil
}

// retryTransfer moves the step again: released back to pending (the
// scheduler routes it, avoiding the member that sat on it where the mode
// allows a choice) and its task deleted from that member's queue.
func (x *transfers) retryTransfer(ctx context.Context, w *transferWatch, st *jobstore.Step, member string, raw *jetstream.RawStreamMsg) error {
	n := w.retries + 1
	why := cluster.TransferRetryReason(w.cluster, member, n, w.policy)
	if st.State == jobstore.StepDispatched {
		out, err := x.release.release(ctx, st.JobID, st.ID, cause{status: statusTransferred, reason: why,
			agent: st.Actor, epoch: st.Epoch, task: raw})
		if err != nil {
			return err
		}
		if out == untouched {
			// It moved on between the read and the release: look again.
			w.due = x.term.now().Add(x.retry)
			return nil
		}
		x.dead.dropTask(ctx, raw)
	}
	w.retries, w.from, w.epoch, w.at = n, member, st.Epoch, x.term.now()
	w.due = w.at.Add(w.policy.Timeout)
	x.metrics.transferRetries.WithLabelValues(w.cluster).Inc()
	x.log.Warn().Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Str("cluster", w.cluster).Str("member", member).
		Int("retry", n).Int("max_retries", w.policy.MaxRetries).Msg("transferred step not taken up: moved again")
	x.adv.AdvanceOrRetry(ctx, st.JobID)
	return x.term.event(ctx, protocol.Event{Kind: protocol.EventClusterTransferRetry, ID: st.JobID, JobID: st.JobID, StepID: st.ID,
		Agent: member, Reason: why, Data: map[string]string{"cluster": w.cluster, "member": member, "retry": strconv.Itoa(n),
			"max_retries": strconv.Itoa(w.policy.MaxRetries), "timeout": w.policy.Timeout.String()}})
}

// giveUp dead-letters the step (transfer_timeout), unless its job is being
// cancelled: then it ends cancelled as any released step would. The step
// must still be as judge found it (w.judged, state and epoch; unset: as
// its first read here finds it): one dispatched again, or reported on,
// since is never parked for what an earlier dispatch did not do; giveUp
// returns errMovedOn and it is judged again. raw is the step's task in the
// member's queue, if judge found one: it is deleted only once the park has
// landed (see park), so a give-up interrupted before that finds it again
// when judged again, not taken up; a step that moved on to its end
// meanwhile needs it no more.
func (x *transfers) giveUp(ctx context.Context, w *transferWatch, member string, raw *jetstream.RawStreamMsg) error {
	why := cluster.TransferGiveUpReason(w.cluster, member, w.policy)
	// The letters of parks that lost their CAS: withdrawn if the step
	// turns out to have moved on (see parkedLetters).
	var sent parkedLetters
	for range maxConflicts {
		st, rev, err := x.store.Step(ctx, w.job, w.step)
		if errors.Is(err, jobstore.ErrNotFound) {
			x.dead.withdraw(ctx, sent, nil, parkedLetter{})
			x.dead.dropTask(ctx, raw)
			return nil
		}
		if err != nil {
			return err
		}
		if st.State.Terminal() {
			x.dead.withdraw(ctx, sent, st, parkedLetter{})
			x.dead.dropTask(ctx, raw)
			return nil
		}
		if w.judged.state == "" {
			w.judged = judgement{state: st.State, epoch: st.Epoch}
		}
		if st.State != w.judged.state || st.Epoch != w.judged.epoch {
			// Dispatched again, or reported on, since it was judged: judge
			// what it is now.
			x.dead.withdraw(ctx, sent, st, parkedLetter{})
			x.log.Info().Str(logging.FieldJob, w.job).Str(logging.FieldStep, w.step).Str("state", string(st.State)).
				Uint64(logging.FieldEpoch, st.Epoch).Msg("transferred step moved on before its give-up: judged again")
			return errMovedOn
		}
		// Judged first: a dispatch made since, which its member may be
		// running, is not ended here; the cancel reaches it as any
		// running step's does.
		if cw, err := cancelWanted(ctx, x.store, st); err != nil || cw {
			if err == nil && st.State == jobstore.StepDispatched {
				_, err = x.release.release(ctx, st.JobID, st.ID, cause{status: statusTransferred, reason: why, agent: st.Actor, epoch: st.Epoch})
				x.adv.AdvanceOrRetry(ctx, st.JobID)
			}
			if err == nil {
				x.dead.withdraw(ctx, sent, st, parkedLetter{})
				// Left queued, a member back before the task's deadline
				// ran it after its job had ended cancelled.
				x.dead.dropTask(ctx, raw)
			}
			return err
		}
		if st.State == jobstore.StepDispatched && (raw == nil || raw.Header.Get(protocol.HeaderEpoch) != strconv.FormatUint(st.Epoch, 10)) {
			raw = nil // the task read is not this dispatch's; the letter is rebuilt from the record
		}
		if st.State == jobstore.StepDispatched {
			// The retry chain ends with the dispatch nobody took up.
			st.EndAttempt(string(protocol.DLQTransferTimeout), why, x.term.now().UTC())
		}
		l, err := x.dead.park(ctx, st, rev, protocol.DLQTransferTimeout, why, raw, 0)
		sent.add(l)
		if errors.Is(err, jobstore.ErrConflict) {
			continue
		}
		if err != nil {
			return err
		}
		x.dead.withdraw(ctx, sent, st, l)
		x.dead.dropTask(ctx, raw) // only now: a give-up tried again needs it (see park)
		x.log.Error().Str(logging.FieldJob, w.job).Str(logging.FieldStep, w.step).Str("cluster", w.cluster).
			Int("retries", w.retries).Msg("transferred step never taken up: dead-lettered")
		x.adv.AdvanceOrRetry(ctx, w.job)
		return nil
	}
	return jobstore.ErrConflict
}

package scheduler

import (
	"cmp"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/internal/selection"
	"github.com/wardenhq/warden/pkg/protocol"
)

// dispatch places up to one slice of the job's ready steps on agents. The
// step record (epoch, actor, lease, token hash) is written before its task
// is published, so a task never exists for an epoch the store lacks.
func (w *worker) dispatch(jt *jobTurn, now time.Time) {
	js := jt.js
	w.forgetArrived(jt)
	if js.job.StopsSteps() {
		w.cancel(jt, now)
		return
	}
	var (
		putBack []int
		wait    time.Duration
	)
	waitAtLeast := func(d time.Duration) {
		if wait == 0 || d < wait {
			wait = max(d, 10*time.Millisecond)
		}
	}
	// Fair share: a job of several steps may hold at most a share of the
	// slots of the agents that can run a step (its pool's agents offering
	// its action, with every capability it requires), so that a fan-out
	// never takes every slot and a small job submitted beside it starts at
	// once. Counted over every agent of the action, a fan-out of gpu steps
	// in a pool of 2 gpu and 2 cpu agents took both gpu slots.
	var (
		held   map[shareKey]int
		limits map[shareKey]int // this turn's, per key
	)
	shareOf := func(st *jobstore.Step) bool {
		if len(js.steps) == 1 || w.s.cfg.MaxJobShare >= 1 {
			return true
		}
		if held == nil {
			held, limits = map[shareKey]int{}, map[shareKey]int{}
			for _, o := range js.steps {
				if o.State == jobstore.StepDispatched {
					keys, n := shareKeys(o)
					for _, k := range keys[:n] {
						held[k]++
					}
				}
			}
		}
		keys, n := shareKeys(st)
		for _, k := range keys[:n] {
			limit, ok := limits[k]
			if !ok {
				var requires []string // as decisions ask for them: the selector's view of the query is theirs
				if k.requires != "" {
					requires = st.Requires
				}
				limit = max(1, int(float64(w.s.selector.CapacityFor(k.pool, k.action, requires))*w.s.cfg.MaxJobShare))
				limits[k] = limit
			}
			if held[k] >= limit {
				return false
			}
		}
		for _, k := range keys[:n] {
			held[k]++
		}
		return true
	}
	// A turn tries at most sliceDispatch steps. Steps it puts back without
	// trying (a retry in its backoff, a pool and action at the job's share)
	// do not count: a round over a large fan-out at its share is then one
	// turn, not one per four steps.
	for tries := 0; tries < sliceDispatch; {
		i, ok := js.nextReady()
		if !ok {
			break
		}
		st := js.steps[i]
		holder := holderID(st.JobID, st.ID)
		if st.Desired == jobstore.StepCancelled {
			tries++
			w.endUnrun(jt, i, now, func(st *jobstore.Step, now time.Time) {
				st.State, st.LastError, st.UpdatedAt, st.FinishedAt = jobstore.StepCancelled, protocol.ErrorCancelled+" by an operator", now, now
			}, "", nil)
			continue
		}
		if st.Expired(now) && st.Attempt > 0 {
			// It ran and waits for a retry (or was taken back from its
			// agent): the expiry bounds when a step may start, not how
			// long a started one retries, and no attempt starts past it.
			// It fails with the error it has, not as expired.
			tries++
			w.endUnrun(jt, i, now, (*jobstore.Step).FailPastExpiry, "", nil)
			w.log.Warn().Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Time("expires_at", st.ExpiresAt).
				Str("error", st.LastError).Msg("step failed: its next attempt would start after its expiry")
			continue
		}
		if st.Expired(now) {
			tries++
			w.log.Warn().Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Time("expires_at", st.ExpiresAt).
				Msg("step expired before it could start")
			w.endUnrun(jt, i, now, (*jobstore.Step).Expire, protocol.EventStepExpired, nil)
			continue
		}
		if st.NotBefore.After(now) {
			// A retry in its backoff: its waiter's retryAt brings the job
			// back then.
			w.s.stopWaiting(holder)
			putBack = append(putBack, i)
			waitAtLeast(st.NotBefore.Sub(now))
			continue
		}
		if st.Agent == "" && st.Cluster == "" && !shareOf(st) {
			// The job holds its share; a freed slot wakes it.
			w.s.stopWaiting(holder)
			putBack = append(putBack, i)
			waitAtLeast(w.s.cfg.CapacityRetry.Std())
			jt.agentWait = true
			continue
		}
		tries++
		prio := jt.js.job.Spec.StepPriority(jt.js.job.Spec.Steps[i])
		behind := func() {
			// A step of higher (effective) priority waits for this pool:
			// it takes the next free slot (priority.go). This one waits
			// for a slot too: a freed one wakes it.
			putBack = append(putBack, i)
			waitAtLeast(w.s.cfg.CapacityRetry.Std())
			jt.agentWait = true
			if why := errBehind.Error(); st.Waiting != why {
				st.Waiting, st.UpdatedAt = why, now
				js.markStep(i)
			}
		}
		class := slotClass{req: w.s.request(st, ""), any: st.Cluster != ""}
		var peek func() (protocol.Presence, error) // the agent the step would get
		if st.Cluster == "" {
			peek = func() (protocol.Presence, error) { return w.s.selector.Peek(class.req) }
		}
		if w.s.behind(holder, st.Pool, class, prio, now, peek) {
			behind() // before taking gates it would give back
			continue
		}
		ok, at, why, fail := w.admit(jt, i, now)
		if fail != nil {
			// Its rate limit stayed unknown past the grace: it never
			// passes, and waiting would leave the job open for ever.
			w.log.Warn().Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Err(fail).Msg("step failed: unknown rate limit")
			w.endUnrun(jt, i, now, func(st *jobstore.Step, now time.Time) { st.Fail(fail.Error(), now) }, protocol.EventStepFailedUnknownLimit,
				map[string]string{"rate_limit": jt.js.job.Spec.Steps[i].RateLimit})
			continue
		}
		if !ok {
			// A concurrency key or rate limit holds the step back; a
			// freed slot wakes the job sooner (releaseGates, giveBackSlots). Until it
			// passes, it does not hold back lower work.
			w.s.stopWaiting(holder)
			putBack = append(putBack, i)
			waitAtLeast(max(at.Sub(now), gateMinWait))
			w.wakeAt(jt.id, at)
			if st.Waiting != why {
				st.Waiting, st.UpdatedAt = why, now
				js.markStep(i)
			}
			continue
		}
		// The final look at the backlog and the choice are one (take).
		agent, err := w.s.take(holder, st.Pool, class, prio, now, peek, func(on string) (protocol.Presence, error) {
			if st.Cluster == "" {
				return w.s.selector.Choose(w.s.request(st, on))
			}
			// Through a cluster (cluster.go): the member's pool is the step's.
			agent, epoch, err := w.s.chooseCluster(st)
			if err == nil {
				st.Pool, st.ClusterEpoch = agent.Pool, epoch
			}
			return agent, err
		})
		if err != nil {
			w.unadmit(jt, i)
		}
		if errors.Is(err, errBehind) {
			behind()
			continue
		}
		if errors.Is(err, selection.ErrUnknownAction) || errors.Is(err, cluster.ErrTargetRequired) {
			w.log.Warn().Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Err(err).Msg("step failed: unknown action")
			st.Fail(err.Error(), now)
			js.markStep(i)
			js.stepEnded(i, now)
			continue
		}
		if err != nil {
			putBack = append(putBack, i)
			jt.agentWait = true
			if errors.Is(err, selection.ErrAtCapacity) {
				waitAtLeast(w.s.cfg.CapacityRetry.Std())
			} else {
				waitAtLeast(w.s.cfg.WaitRetry.Std())
			}
			// Say why on the step, once, so `warden job show` explains the wait.
			if why := err.Error(); st.Waiting != why {
				st.Waiting, st.UpdatedAt = why, now
				js.markStep(i)
			}
			continue
		}
		token := protocol.NewLeaseToken()
		if err := st.Dispatch(agent.ID, token, now, w.s.cfg.DispatchGrace.Std()); err != nil {
			w.unadmit(jt, i)
			continue // not pending: nothing to do
		}
		js.markStep(i)
		jt.tasks = append(jt.tasks, task{idx: i, msg: w.s.taskMsg(st, st.Pool, agent.ID, token)})
		jt.count(i, countStepDispatched, "")
		w.log.Debug().Str(logging.FieldJob, st.JobID).Str(logging.FieldStep, st.ID).Str(logging.FieldAgent, agent.ID).
			Uint64(logging.FieldEpoch, st.Epoch).Int("attempt", st.Attempt).Msg("step dispatched")
	}
	// A round tries every ready step once, a slice a turn. Steps put back
	// wait behind the others until the round ends: put back in front, as
	// before, four blocked steps were taken again every turn, the steps
	// behind them never, and the continuation spun at full speed.
	js.blocked = append(js.blocked, putBack...)
	if len(putBack) > 0 {
		if js.blockedWait == 0 || wait < js.blockedWait {
			js.blockedWait = wait
		}
		js.blockedAgent = js.blockedAgent || jt.agentWait
	}
	if len(js.ready) > 0 {
		jt.more = true
		return
	}
	js.ready, js.blocked = js.blocked, js.ready[:0]
	jt.wait, jt.agentWait = js.blockedWait, js.blockedAgent
	js.blockedWait, js.blockedAgent = 0, false
}

// cancel carries out a job's desired state cancelled: no step is
// dispatched again, pending ones end cancelled, running ones are told to
// stop (they end cancelled with their result, or when their lease ends).
func (w *worker) cancel(jt *jobTurn, now time.Time) {
	js := jt.js
	asked := false // an advance request: every running step is told again
	why := protocol.ErrorCancelled + " by an operator"
	if js.job.TimedOut {
		why = protocol.ErrorCancelled + ": " + js.job.TimeoutError()
	}
	for _, in := range jt.inputs {
		asked = asked || in.kind == inAdvance
	}
	for i, st := range js.steps {
		switch st.State {
		case jobstore.StepPending:
			w.s.stopWaiting(holderID(st.JobID, st.ID))
			w.freeIfQueued(jt, i)
			st.Desired, st.State = jobstore.StepCancelled, jobstore.StepCancelled
			st.LastError, st.UpdatedAt, st.FinishedAt = why, now, now
			js.markStep(i)
			// Not stepEnded: it would skip the step's pending dependents,
			// which this loop cancels anyway. A skip was once written in
			// the same round as its cause and landed when the cause's
			// write lost (the job's owner dispatched the step meanwhile: a
			// cancel or timeout handled by another scheduler); the
			// dependent then went from skipped to cancelled (the chaos
			// suite). Skips now wait for their cause (writes), and a
			// cancelled dependent is right whatever became of the step.
			js.open--
		case jobstore.StepDispatched:
			write := noWrite
			if st.Desired != jobstore.StepCancelled {
				st.Desired, st.UpdatedAt = jobstore.StepCancelled, now
				js.markStep(i)
				write = i
			}
			if asked || write == i {
				b, _ := json.Marshal(protocol.Control{Op: protocol.ControlCancel, JobID: st.JobID, StepID: st.ID, Epoch: st.Epoch, Token: st.Token})
				jt.controls = append(jt.controls, control{subject: protocol.AgentControlSubject(st.Pool, st.Actor), body: b, write: write})
			}
		}
	}
	js.ready, js.blocked = js.ready[:0], js.blocked[:0]
	js.blockedWait, js.blockedAgent = 0, false
}

// shareKey keys the job's share of the slots of the agents that can run
// a step: its pool, action and required capabilities (sorted, each once,
// joined by NUL: ["gpu","fast"] and ["fast","gpu"] are one share).
type shareKey struct{ pool, action, requires string }

// shareKeys are the shares a step counts against: of the agents offering
// its action (any capabilities), and, when it requires some, of those with
// every one of them.
func shareKeys(st *jobstore.Step) (keys [2]shareKey, n int) {
	keys[0] = shareKey{pool: st.Pool, action: st.Action}
	if len(st.Requires) == 0 {
		return keys, 1
	}
	req := st.Requires
	if len(req) > 1 {
		req = slices.Compact(slices.Sorted(slices.Values(req)))
	}
	keys[1] = shareKey{st.Pool, st.Action, strings.Join(req, "\x00")}
	return keys, 2
}

// forgetArrived forgets the steps a submission registered on arrival
// (priority.go) that do not wait to be dispatched: its job existed, and
// they ran or are running. Pending ones are settled by dispatch below.
func (w *worker) forgetArrived(jt *jobTurn) {
	if !slices.ContainsFunc(jt.inputs, func(in input) bool { return in.kind == inSubmit }) {
		return
	}
	for _, st := range jt.js.steps {
		if len(st.DependsOn) == 0 && st.State != jobstore.StepPending {
			w.s.stopWaiting(holderID(st.JobID, st.ID))
		}
	}
}

// request is the selector's request for a step, on agent when set (the
// one a look at the backlog allowed it), else on its pinned agent if any.
func (s *Scheduler) request(st *jobstore.Step, agent string) selection.Request {
	return selection.Request{Pool: st.Pool, Agent: cmp.Or(agent, st.Agent), Action: st.Action, Requires: st.Requires}
}

// release frees an agent's slot in the selector when its result arrives.
func (s *Scheduler) release(pool, agent string, at time.Time) {
	s.selector.Release(protocol.PresenceKey(pool, agent), at)
	s.wakeAll() // a waiting step may take the slot now
}

// taskMsg builds a dispatch's task. The subject is derived from the pool
// and agent id, never read from the agent's presence record, so a forged
// presence cannot redirect tasks.
func (s *Scheduler) taskMsg(st *jobstore.Step, pool, agent, token string) *nats.Msg {
	t := protocol.Task{
		JobID: st.JobID, StepID: st.ID, Epoch: st.Epoch, Attempt: st.Attempt, Action: st.Action,
		Params: st.Params, Timeout: st.Timeout, Deadline: st.LockedUntil, ExpiresAt: st.ExpiresAt, Token: token,
	}
	b, _ := json.Marshal(t) // a Task always encodes
	m := nats.NewMsg(protocol.TaskSubject(protocol.Shard(pool, agent, s.cfg.TaskShards), pool, agent))
	m.Data = b
	m.Header.Set(protocol.HeaderMsgID, protocol.TaskMsgID(st.JobID, st.ID, st.Epoch))
	m.Header.Set(protocol.HeaderJob, st.JobID)
	m.Header.Set(protocol.HeaderStep, st.ID)
	m.Header.Set(protocol.HeaderEpoch, strconv.FormatUint(st.Epoch, 10))
	m.Header.Set(protocol.HeaderAttempt, strconv.Itoa(st.Attempt))
	m.Header.Set(protocol.HeaderAction, st.Action)
	m.Header.Set(protocol.HeaderDeadline, st.LockedUntil.UTC().Format(time.RFC3339Nano))
	m.Header.Set(protocol.HeaderToken, token)
	if st.Recoveries > 0 {
		m.Header.Set(protocol.HeaderRecoveries, strconv.Itoa(st.Recoveries))
	}
	if st.TransferredFrom != "" {
		m.Header.Set(protocol.HeaderTransferredFrom, st.TransferredFrom)
	}
	setClusterHeaders(m.Header, st)
	return m
}

// endUnrun ends pending step i in this dispatch round without running it:
// it leaves the waiters and its key's queue, end changes its record, and
// an event of kind (none if "") says why, with data.
func (w *worker) endUnrun(jt *jobTurn, i int, now time.Time, end func(*jobstore.Step, time.Time), kind protocol.EventKind, data map[string]string) {
	st := jt.js.steps[i]
	w.s.stopWaiting(holderID(st.JobID, st.ID))
	w.freeIfQueued(jt, i)
	end(st, now)
	jt.js.markStep(i)
	jt.js.stepEnded(i, now)
	if kind != "" {
		ev := protocol.Event{Kind: kind, ID: st.JobID, JobID: st.JobID, StepID: st.ID, Reason: st.LastError, Data: data}
		jt.events = append(jt.events, outEvent{Event: ev, dedup: st.ID, write: i})
	}
}

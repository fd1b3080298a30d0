package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/pkg/protocol"
)

// FailoverRecord is published (event kind "failover") for every failover.
type FailoverRecord struct {
	ID         string        `json:"id"`
	Agent      string        `json:"agent"`
	Pool       string        `json:"pool"`
	Targets    []string      `json:"targets,omitempty"`
	TasksMoved int           `json:"tasks_moved"`
	Waiting    int           `json:"waiting"`
	StartedAt  time.Time     `json:"started_at"`
	Duration   time.Duration `json:"duration"`
	Outcome    string        `json:"outcome"`
}

// Failover outcomes.
const (
	OutcomeTransferred = "transferred"
	OutcomeNoTarget    = "no_target"
	OutcomeNothing     = "nothing_to_move"
)

// failover moves an agent's work (a failed agent's, or a present one's
// that healing or an operator moves: see transferLive): every task in its
// own queue whose step the agent still holds at the task's epoch is
// released (a scheduler re-dispatches it with a new epoch), a step of a
// cancelled job ends cancelled, a step that keeps killing its agents is
// parked; then the task message is deleted from the agent's queue. It
// touches only the queue its pool and id derive (see queue), never what a
// presence record names.
type failover struct {
	js      jetstream.JetStream
	term    *term
	store   *jobstore.Store
	release *releaser
	adv     *advancer
	metrics *Metrics
	shards  int
	log     zerolog.Logger
	// transfers bounds the moved steps of cluster members (nil: unbounded
	// but for their leases).
	transfers *transfers
}

// departure says how an agent whose queue is moved left, which decides
// whether the tasks it had in hand count towards their steps' poison
// threshold (see cause.suspect).
type departure int

const (
	// agentFailed: its presence expired (it crashed, hung or was cut
	// off), or it is gone for a reason nobody saw. Its tasks in hand are
	// suspects: it may have died of one of them.
	agentFailed departure = iota
	// agentStopped: it deleted its own presence, as an agent does at
	// the end of a graceful stop, having handed back (or finished) what it
	// ran: nothing crashed, and its tasks in hand are no suspects.
	agentStopped
	// agentPresent: it has not left (a healing drain or failover, an
	// operator's order); no suspects either.
	agentPresent
)

// transfer fails over agent pool.agent, which departed (how: failed or
// stopped), now; trigger names what caused it (a departure) and makes the
// record's id. The tasks a failed agent had in hand count towards their
// steps' poison threshold: it may have died of one of them. Those of an
// agent that stopped cleanly do not: it lived to hand them back, and
// counting them dead-lettered a long step as poison after three graceful
// stops (a rolling restart, a scale-down).
func (f *failover) transfer(ctx context.Context, pool, agent, trigger string) (FailoverRecord, error) {
	return f.move(ctx, pool, agent, trigger, agentFailed)
}

// transferStopped is transfer for an agent that stopped cleanly (see
// agentStopped).
func (f *failover) transferStopped(ctx context.Context, pool, agent, trigger string) (FailoverRecord, error) {
	return f.move(ctx, pool, agent, trigger, agentStopped)
}

// transferLive moves the queue of agent pool.agent, which is present (a
// healing drain or failover, an operator's order), as transfer does; but
// the tasks it had in hand do not count towards poison: nothing crashed,
// and counting them dead-lettered a long step moved off three drained
// agents as poison. Only crashes (expired presences) and lease expiries
// count.
func (f *failover) transferLive(ctx context.Context, pool, agent, trigger string) (FailoverRecord, error) {
	return f.move(ctx, pool, agent, trigger, agentPresent)
}

// move moves agent pool.agent's queue; how says how the agent left.
func (f *failover) move(ctx context.Context, pool, agent, trigger string, how departure) (FailoverRecord, error) {
	rec := FailoverRecord{ID: failoverID(pool, agent, trigger), Agent: agent, Pool: pool, StartedAt: f.term.now().UTC()}
	q, ok := agentQueue(pool, agent, f.shards)
	if !ok {
		return rec, fmt.Errorf("failover: %q.%q is not a valid agent", pool, agent)
	}
	if err := f.term.fence(); err != nil {
		return rec, err
	}
	moved, err := f.drainQueue(ctx, q, how, &rec)
	// Every job that lost a step is asked to advance, also when the
	// drain stopped part-way: the steps released so far run now, not
	// after the recovery grace (the failover tried again finds them
	// pending, none of its doing, and does not ask for them).
	for job := range moved {
		f.adv.AdvanceOrRetry(ctx, job)
	}
	if err != nil {
		return rec, err
	}
	f.settle(ctx, moved, &rec)
	f.metrics.failovers.WithLabelValues(rec.Outcome).Inc()
	f.metrics.transferred.Add(float64(rec.TasksMoved))
	return rec, f.publish(ctx, rec)
}

// failoverID derives a failover's id from the agent and its trigger, so
// that the same failover described twice has one id.
func failoverID(pool, agent, trigger string) string {
	sum := sha256.Sum256([]byte(pool + "." + agent + "|" + trigger))
	return "fo-" + hex.EncodeToString(sum[:10])
}

// drainQueue releases the step of every task in q and deletes the task;
// it returns the steps released, by job (a job with no step is one whose
// step was parked or cancelled: it must move on too), on an error too.
// how says how q's agent left (see transfer).
func (f *failover) drainQueue(ctx context.Context, q queue, how departure, rec *FailoverRecord) (map[string][]string, error) {
	stream, err := f.js.Stream(ctx, q.stream)
	if err != nil {
		return nil, fmt.Errorf("task stream %s: %w", q.stream, err)
	}
	// Tasks past the consumer's delivered sequence never reached the agent.
	delivered := uint64(0)
	if cons, err := stream.Consumer(ctx, q.consumer); err == nil {
		if info, err := cons.Info(ctx); err == nil {
			delivered = info.Delivered.Stream
		}
	}
	moved := map[string][]string{}
	for seq := uint64(1); ; {
		raw, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(q.subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return moved, nil
		}
		if err != nil {
			return moved, fmt.Errorf("read queue of %s: %w", q.agent, err)
		}
		seq = raw.Sequence + 1
		if raw.Subject != q.subject {
			continue // never: the read is filtered on the agent's own subject
		}
		if err := f.transferTask(ctx, q, raw, how, raw.Sequence <= delivered, moved, rec); err != nil {
			return moved, err
		}
		if err := f.term.deleteMsg(ctx, stream, raw.Sequence); err != nil {
			return moved, fmt.Errorf("delete transferred task: %w", err)
		}
	}
}

// transferTask releases the step one queued task stands for; inFlight says
// the agent's consumer delivered it. It is a suspect (see cause) only if
// the agent failed with it in hand.
func (f *failover) transferTask(ctx context.Context, q queue, raw *jetstream.RawStreamMsg, how departure, inFlight bool,
	moved map[string][]string, rec *FailoverRecord) error {
	job, step := raw.Header.Get(protocol.HeaderJob), raw.Header.Get(protocol.HeaderStep)
	epoch, _ := strconv.ParseUint(raw.Header.Get(protocol.HeaderEpoch), 10, 64)
	if !protocol.ValidToken(job) || !protocol.ValidToken(step) || epoch == 0 {
		return nil // not a task of ours; deleted from the agent's queue
	}
	reason := "agent " + q.agent + " failed"
	switch how {
	case agentStopped:
		reason = "agent " + q.agent + " stopped and did not return"
	case agentPresent:
		reason = "moved off agent " + q.agent + ", present"
	}
	out, err := f.release.release(ctx, job, step, cause{status: statusTransferred, reason: reason,
		agent: q.agent, epoch: epoch, suspect: how == agentFailed && inFlight, task: raw})
	if err != nil {
		return err
	}
	switch out {
	case requeued:
		moved[job] = append(moved[job], step)
		rec.TasksMoved++
		if c := raw.Header.Get(protocol.HeaderCluster); c != "" {
			f.transfers.note(transferNote{job: job, step: step, cluster: c, from: q.pool + "." + q.agent, epoch: epoch, at: f.term.now()})
		}
	case cancelled, parked:
		if _, ok := moved[job]; !ok {
			moved[job] = nil
		}
	}
	return nil
}

// settle records where the moved steps went (move asked their jobs to
// advance).
func (f *failover) settle(ctx context.Context, moved map[string][]string, rec *FailoverRecord) {
	targets := map[string]bool{}
	for job, steps := range moved {
		for _, id := range steps {
			st, _, err := f.store.Step(ctx, job, id)
			switch {
			case err != nil:
			case st.State == jobstore.StepDispatched:
				targets[st.Actor] = true
			case st.State == jobstore.StepPending:
				rec.Waiting++
			}
		}
	}
	for t := range targets {
		rec.Targets = append(rec.Targets, t)
	}
	rec.Duration = f.term.now().Sub(rec.StartedAt)
	switch {
	case rec.TasksMoved == 0:
		rec.Outcome = OutcomeNothing
	case rec.Waiting > 0:
		rec.Outcome = OutcomeNoTarget
	default:
		rec.Outcome = OutcomeTransferred
	}
}

func (f *failover) publish(ctx context.Context, r FailoverRecord) error {
	log := f.log.With().Str("failover_id", r.ID).Str("agent", r.Agent).Logger()
	e := log.Info()
	if r.Outcome == OutcomeNoTarget {
		e = log.Warn()
	}
	e.Strs("targets", r.Targets).Int("tasks_moved", r.TasksMoved).Int("waiting", r.Waiting).
		Dur("duration", r.Duration).Str("outcome", r.Outcome).Msg("failover")
	data := map[string]string{
		"failover_id": r.ID, "pool": r.Pool, "targets": strings.Join(r.Targets, ","),
		"tasks_moved": strconv.Itoa(r.TasksMoved), "waiting": strconv.Itoa(r.Waiting),
		"started_at": r.StartedAt.Format(time.RFC3339Nano), "duration": r.Duration.String(), "outcome": r.Outcome,
	}
	reason := ""
	if r.Outcome == OutcomeNoTarget {
		reason = fmt.Sprintf("%d tasks wait: no other agent of pool %s can take them", r.Waiting, r.Pool)
	}
	return f.term.eventOnce(ctx, protocol.Event{Kind: protocol.EventFailover, ID: r.ID, Agent: r.Agent, Reason: reason, Data: data}, r.ID)
}

// departureTrigger names one departure of an agent: the life it ended.
func departureTrigger(c presence.Change) string {
	return "departed:" + c.Presence.StartedAt.UTC().Format(time.RFC3339Nano) + ":" + c.Presence.HeartbeatAt.UTC().Format(time.RFC3339Nano)
}

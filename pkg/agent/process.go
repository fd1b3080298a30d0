package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/pkg/agent/internal/testhook"
	"github.com/wardenhq/warden/pkg/protocol"
)

// runningTask is a delivery this agent is handling (Agent.running, keyed by
// "<job>.<step>.<epoch>"): a pointer, so that a run removes only its own
// entry.
type runningTask struct {
	cancel context.CancelCauseFunc
}

// outcome is what became of a handler run.
type outcome struct {
	out       json.RawMessage // encoded (call)
	err       error
	abandoned bool // the handler ignored cancellation and is still running
}

// process runs one task message to its end: a published result and an ack,
// a hand-back, or (lease lost, deadline passed) nothing at all. It owns
// hold (see taskHold) with the handler it starts.
func (a *Agent) process(workCtx context.Context, msg jetstream.Msg, delivery uint64, hold *taskHold) {
	defer hold.done()
	received := a.now()
	pt, err := decodeTask(msg)
	if err != nil {
		a.stats.rejected.Add(1)
		a.log.Error().Err(err).Str("subject", msg.Subject()).Uint64("delivery", delivery).
			Msg("terminating a task message that cannot be decoded")
		a.deadLetter(msg, protocol.DLQUndecodable, err.Error())
		return
	}
	log := a.log.With().Str(logging.FieldJob, pt.JobID).Str(logging.FieldStep, pt.StepID).
		Uint64(logging.FieldEpoch, pt.Epoch).Str("action", pt.Action).Uint64("delivery", delivery).Logger()
	task := &Task{Task: pt, Delivery: delivery, Log: log}
	// One delivery of a dispatch at a time, whatever it is about to do
	// (run, report expiry, dead-letter): a second delivery that reported
	// "expired" would store its result under the run's Nats-Msg-Id first.
	runKey := protocol.TaskMsgID(pt.JobID, pt.StepID, pt.Epoch)
	hctx, cancelHandler := context.WithCancelCause(workCtx)
	defer cancelHandler(context.Canceled)
	run := &runningTask{cancel: cancelHandler}
	_, dup := a.running.LoadOrStore(runKey, run)
	if !dup {
		defer a.running.CompareAndDelete(runKey, run)
	}
	// Checked after registering: a run that ended has recorded its report
	// before it stopped counting as running. A stored result settles this
	// delivery whatever brought it (a lost ack, a task published again as
	// another message, which the run's own ack does not settle, a
	// redelivery): see recentReports.
	if stored, ok := a.reported.get(pt, received); ok {
		log.Info().Bool("result_kept", stored != nil).
			Msg("delivered again after its result was stored here: reporting that result again and acking it, unrun")
		a.reportAgain(workCtx, msg, stored, pt.Deadline, log)
		return
	}
	if dup {
		// A re-created task consumer (after a restart of a lone server,
		// which forgets it) delivers again what this agent runs. The run in
		// progress reports, and its ack (by stream sequence) settles this
		// delivery too.
		log.Info().Msg("task delivered again while it runs here: leaving it to the run in progress")
		return
	}

	p, ok := planTask(received, pt.Deadline, pt.Timeout.Std())
	if !ok {
		// Too late to run and report: the step's lease is over and the
		// supervisor re-dispatches it with a new epoch.
		a.stats.expired.Add(1)
		log.Warn().Time("deadline", pt.Deadline).Msg("task arrived after its deadline; dead-lettering it unrun")
		a.deadLetter(msg, protocol.DLQExpired, "deadline "+pt.Deadline.UTC().Format(time.RFC3339Nano)+" passed before the task started")
		return
	}
	if a.cancels.take(runKey, pt.Token, received) {
		log.Info().Msg("cancelled before it was delivered here: reporting it cancelled unrun")
		a.report(workCtx, msg, pt, p, buildResult(task, a.cfg.Pool, a.cfg.ID, received, a.now(), nil, cancelledBy(ErrCancelled)), log)
		return
	}

	if !pt.ExpiresAt.IsZero() && received.After(pt.ExpiresAt) {
		// Expired in a queue: say so, so the step fails with a reason
		// instead of running late.
		log.Warn().Time("expires_at", pt.ExpiresAt).Int("attempt", pt.Attempt).Msg("task expired before it started")
		err := Permanent(a.expiredError(pt, received))
		a.report(workCtx, msg, pt, p, buildResult(task, a.cfg.Pool, a.cfg.ID, received, received, nil, err), log)
		return
	}
	// A hand-back redelivers at once: the run stops counting as running
	// before it, or its redelivery would be taken for a duplicate.
	handBack := func() {
		a.running.CompareAndDelete(runKey, run)
		a.handBack(msg)
	}
	started := a.now()
	log.Debug().Time("deadline", pt.Deadline).Msg("task started")

	// The lease keeper lives until the task is acked or abandoned, so that
	// publishing the result is covered too.
	keeperCtx, stopKeeper := context.WithCancel(workCtx)
	keeperDone := make(chan struct{})
	keeper := newLeaseKeeper(a.nc, msg.Reply(), a.cfg.Lease.Std(), received, p.reportBy, a.now,
		func() { cancelHandler(ErrLeaseLost) }, log)
	go func() { defer close(keeperDone); keeper.run(keeperCtx) }()
	defer func() { stopKeeper(); <-keeperDone }()

	// A suspect waits here, its lease kept, until it can run alone, at most
	// until its handler's deadline: past it the lease keeper stops (it
	// extends no lease beyond the deadline), and a suspect still waiting
	// lost its lease, was handed back unreported, dead-lettered unrun as
	// expired at its redelivery, and counted as a recovery (poison after
	// three). It is reported as a handler that could not start instead.
	// (Anything else has its slot at once: tasks are fetched for free
	// slots only.)
	suspect, waitCtx := isSuspect(delivery, msg.Headers().Get(protocol.HeaderRecoveries)), hctx
	if suspect && !p.handlerDeadline.IsZero() {
		var stopWait context.CancelFunc
		waitCtx, stopWait = context.WithDeadlineCause(hctx, p.handlerDeadline, p.deadlineCause(task))
		defer stopWait()
	}
	release := a.iso.acquire(waitCtx, suspect)
	if release == nil && hctx.Err() == nil {
		log.Warn().Msg("deadline passed while waiting to run alone: reporting it not started")
		a.report(workCtx, msg, pt, p, buildResult(task, a.cfg.Pool, a.cfg.ID, started, a.now(), nil, notStarted(context.Cause(waitCtx))), log)
		return
	}
	if release == nil {
		cause := context.Cause(hctx)
		if errors.Is(cause, ErrConnectionClosed) {
			log.Warn().Msg("connection closed for good while waiting to run: abandoning the task; the supervisor re-dispatches it")
			return
		}
		if errors.Is(cause, ErrCancelled) {
			// Handed back, the redelivery would carry no cancel and run.
			log.Info().Msg("cancelled while waiting to run: reporting it cancelled unrun")
			a.report(workCtx, msg, pt, p, buildResult(task, a.cfg.Pool, a.cfg.ID, started, a.now(), nil, cancelledBy(cause)), log)
			return
		}
		log.Info().Msg("stopped while waiting to run: handing the task back")
		handBack()
		return
	}
	hold.add(release)
	if delivery > 1 {
		log.Warn().Msg("redelivered task: running it alone in case it is what killed the last run")
	}

	h, allowed := a.allowed[pt.Action]
	var o outcome
	admitErr := a.clusterAdmit(msg)
	if admitErr != nil {
		o.err = admitErr
	} else if allowed {
		o = runHandler(hctx, handlerEnv{now: a.now, hold: hold, abandoned: &a.stats.abandoned}, p, h, task)
	} else {
		o.err = Permanent(fmt.Errorf("unknown action %q (this agent allows: %s)", pt.Action, strings.Join(a.allowedNames, ", ")))
	}
	cause := context.Cause(hctx)
	switch {
	case errors.Is(cause, ErrLeaseLost):
		// The task may already run elsewhere: a report could only confuse.
		a.stats.leaseLost.Add(1)
		log.Warn().Time("lease_until", keeper.Believed()).Msg("lease lost: abandoning the task without a report")
		return
	case errors.Is(cause, ErrConnectionClosed):
		// Whatever the handler made of it, nothing can be reported or
		// handed back: the supervisor moves the step to another agent.
		log.Warn().Bool("handler_failed", o.err != nil).
			Msg("connection closed for good: abandoning the task unreported; the supervisor re-dispatches it")
		return
	case a.hooks != nil && errors.Is(o.err, testhook.ErrDrop):
		// A test kit's agent "crashing" with the task: hand it back, say
		// nothing. Only there: agenttest.ErrDrop is public, and returned
		// by a real handler its task came back unreported, silently, until
		// max_deliver.
		log.Info().Msg("handler dropped the task: handing it back unreported")
		handBack()
		return
	case errors.Is(cause, ErrCancelled):
		// An operator cancelled the step: report it, so it ends cancelled.
		o = outcome{err: cancelledBy(firstErr(o.err, cause))}
	case o.err != nil && errors.Is(cause, ErrShutdown):
		log.Info().Msg("cancelled by shutdown: handing the task back")
		handBack()
		return
	}
	if stack, ok := isPanic(o.err); ok {
		log.Error().Err(o.err).Bytes("stack", stack).Msg("handler panicked")
	}
	if admitErr == nil {
		if err := a.clusterFenced(msg, log); err != nil {
			// The handler's outcome is withheld; the reroute refusal
			// hands the step back, as for a task that came too late.
			o = outcome{err: err}
		}
	}
	res := buildResult(task, a.cfg.Pool, a.cfg.ID, started, a.now(), o.out, o.err)
	a.report(workCtx, msg, pt, p, res, log)
}

// expiredError is the failure reported for task t, received at now after
// its expires_at. A first attempt never ran: "expired: not started by …".
// A retry (attempt > 1) follows a failure, and that failure, not the
// expiry, is what the step's error must say: the error a result reports
// becomes the step's last_error, and "expired" alone read as a step that
// never ran. If this agent reported that failure (recentReports), the
// report repeats it as the scheduler words a retry its expiry stopped
// (jobstore's FailPastExpiry): "<error> (not retried: its expires_at …
// passed)". Otherwise it says that a retry expired, and where the step's
// error is.
func (a *Agent) expiredError(t protocol.Task, now time.Time) error {
	at := t.ExpiresAt.UTC().Format(time.RFC3339)
	if t.Attempt <= 1 {
		return fmt.Errorf("expired: not started by %s", at)
	}
	suffix := " (not retried: its expires_at " + at + " passed)"
	if prev, ok := a.reported.previousError(t, now); ok {
		if room := maxErrorBytes - len(suffix) - len(truncatedSuffix); len(prev) > room {
			prev = cutUTF8(prev, room) + truncatedSuffix // the suffix is kept whole
		}
		return errors.New(prev + suffix)
	}
	return fmt.Errorf("expired: attempt %d, a retry, not started by %s; not retried: the step's error is that of its attempt before, in its attempts", t.Attempt, at)
}

// cancelledBy is the error of a step an operator cancelled: permanent, and
// starting with protocol.ErrorCancelled so that it ends cancelled.
func cancelledBy(err error) error {
	return Permanent(fmt.Errorf("%s by an operator: %w", protocol.ErrorCancelled, err))
}

// handlerEnv is what runHandler needs of the agent; Execute runs handlers
// with a zero one but for the clock.
type handlerEnv struct {
	now func() time.Time
	// hold is shared with the handler's goroutine (see taskHold).
	hold *taskHold
	// abandoned counts handlers given up on that still run; nil: not counted.
	abandoned *atomic.Int64
}

// Handler goroutine states (runHandler).
const (
	handlerRunning int32 = iota
	handlerReturned
	handlerAbandoned
)

// runHandler runs h under its deadline. A handler that ignores cancellation
// is waited for a short grace, then reported as failed and left running,
// holding its slot and tokens until it returns (env.hold).
// An error the handler returns once its deadline has passed says so
// (ErrDeadline), whatever the handler made of it: retries classify a step
// by that, as a timeout. A handler whose deadline passed while it waited to
// run (a suspect waiting to run alone) is not started.
func runHandler(hctx context.Context, env handlerEnv, p plan, h HandlerFunc, t *Task) (o outcome) {
	if !p.handlerDeadline.IsZero() {
		cause := p.deadlineCause(t)
		if !env.now().Before(p.handlerDeadline) {
			return outcome{err: notStarted(cause)}
		}
		var cancel context.CancelFunc
		hctx, cancel = context.WithDeadlineCause(hctx, p.handlerDeadline, cause)
		defer cancel()
		defer func() { // before cancel: the cause is the deadline's, if it passed
			if c := context.Cause(hctx); o.err != nil && errors.Is(c, ErrDeadline) && !errors.Is(o.err, ErrDeadline) {
				o.err = fmt.Errorf("%w: %w", c, o.err)
			}
		}()
	}
	done := make(chan outcome, 1)
	var state atomic.Int32 // handlerRunning, then returned or abandoned
	env.hold.share()
	go func() {
		defer env.hold.done()
		// Sent on the way out, also when the handler ends its goroutine
		// with runtime.Goexit (t.FailNow in a handler): recover does not
		// see that, and the task held its slot until its deadline.
		o := outcome{err: Permanent(errGoexit)}
		defer func() {
			if !state.CompareAndSwap(handlerRunning, handlerReturned) && env.abandoned != nil {
				env.abandoned.Add(-1)
			}
			done <- o
		}()
		out, err := call(hctx, h, t)
		o = outcome{out: out, err: err}
	}()
	select {
	case o := <-done:
		return o
	case <-hctx.Done():
	}
	grace := time.NewTimer(p.grace)
	defer grace.Stop()
	select {
	case o := <-done:
		return o
	case <-grace.C:
		if env.abandoned != nil {
			env.abandoned.Add(1) // before the goroutine may take it off
		}
		if !state.CompareAndSwap(handlerRunning, handlerAbandoned) {
			if env.abandoned != nil {
				env.abandoned.Add(-1)
			}
			return <-done // it returned as the grace ended
		}
		t.Log.Error().Dur("grace", p.grace).Msg("handler ignores cancellation; reporting without it (it keeps running, and its slot stays taken until it returns)")
		return outcome{err: fmt.Errorf("handler did not return after cancellation: %w", context.Cause(hctx)), abandoned: true}
	}
}

// errGoexit is the failure of a handler that ended its goroutine with
// runtime.Goexit instead of returning.
var errGoexit = errors.New("handler called runtime.Goexit (t.FailNow?) instead of returning")

// term terminates a message that must never be redelivered.
func (a *Agent) term(msg jetstream.Msg, reason string) {
	if err := msg.TermWithReason(reason); err != nil {
		a.log.Warn().Err(err).Msg("term failed; the message comes back after the lease")
	}
}

// logResult logs a reported result at a level matching its status.
func logResult(log zerolog.Logger, r protocol.Result) {
	ev := log.Info()
	if r.Status == protocol.ResultFailed {
		ev = log.Warn().Str("error", r.Error).Str("error_class", r.ErrorClass)
	}
	ev.Str("status", r.Status).Dur("took", r.FinishedAt.Sub(r.StartedAt)).Msg("task reported")
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

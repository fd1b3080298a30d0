package schedule

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// RelayConsumer is the durable consumer every scheduler's Relay shares.
const RelayConsumer = "schedule-relay"

// handleTimeout bounds one tick's relaying (a submission, an event, the
// next timer), also when the relay is stopping.
const handleTimeout = 10 * time.Second

// reconcileEvery is how often a running relay arms the schedules that have
// no timer of their definition (Reconcile): a definition whose arming
// failed got none until some scheduler started, and never fired.
const reconcileEvery = time.Minute

// reconcileTimeout bounds one Reconcile: a few requests per schedule.
const reconcileTimeout = 5 * time.Minute

// relayQuiet is how long after a tick fired Reconcile leaves its schedule
// to the tick's relay: two ack waits and a handling.
const relayQuiet = 2*relayAckWait + handleTimeout

// relayAckWait is the relay consumer's ack wait.
const relayAckWait = 30 * time.Second

// Relay turns fired ticks into submissions and arms the next tick. Run one
// in every scheduler; they share one durable consumer.
type Relay struct {
	js     jetstream.JetStream
	store  *Store
	events *events.Publisher
	log    zerolog.Logger
	now    func() time.Time

	cancel context.CancelFunc
	done   chan struct{}
	// handling counts ticks being relayed, so Stop can wait for them.
	handling sync.WaitGroup
	// streams are the deployment's stream options (replicas).
	streams streams.Options
	// reconcileEvery and quiet: see reconcileEvery and relayQuiet.
	reconcileEvery, quiet time.Duration
}

// RelayOption configures a Relay.
type RelayOption func(*Relay)

// WithLogger sets the logger.
func WithLogger(l zerolog.Logger) RelayOption { return func(r *Relay) { r.log = l } }

// WithClock sets the clock (tests).
func WithClock(now func() time.Time) RelayOption { return func(r *Relay) { r.now = now } }

// WithReconcileEvery sets how often a running relay reconciles (tests).
func WithReconcileEvery(d time.Duration) RelayOption { return func(r *Relay) { r.reconcileEvery = d } }

// WithStreams sets the deployment's stream options (replicas) the
// schedules stream is ensured with. Defaults to streams.Options{} (R1).
func WithStreams(o streams.Options) RelayOption { return func(r *Relay) { r.streams = o } }

// NewRelay returns a relay on js; Start runs it.
func NewRelay(js jetstream.JetStream, opts ...RelayOption) *Relay {
	r := &Relay{js: js, events: events.NewPublisher(js), log: zerolog.Nop(), now: time.Now, reconcileEvery: reconcileEvery, quiet: relayQuiet}
	for _, o := range opts {
		o(r)
	}
	r.log = r.log.With().Str("component", "schedule").Logger()
	return r
}

// Start ensures the schedules stream, arms the timers of schedules that
// have none, and consumes ticks until Stop or ctx ends. A consumer the
// server loses meanwhile is created again (package keep).
func (r *Relay) Start(ctx context.Context) error {
	if err := streams.EnsureWorkflow(ctx, r.js, r.streams); err != nil {
		return err
	}
	st, err := NewStore(ctx, r.js)
	if err != nil {
		return err
	}
	st.now = r.now
	r.store = st
	if err := r.Reconcile(ctx); err != nil {
		// Not a reason to stop: the next round tries again.
		r.log.Warn().Err(err).Msg("schedules not reconciled at start; tried again in a while")
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	// A tick in progress is finished even when the relay stops: stopping
	// between the submission and the re-arming would leave the schedule
	// with no timer until some relay starts again and the tick is
	// redelivered, so nothing would fire while the others are down.
	k := keptRelayConsumer(r.js, streams.StreamSchedules, relayConsumerConfig(), func(m jetstream.Msg) {
		r.handling.Add(1)
		defer r.handling.Done()
		if rctx.Err() != nil {
			_ = m.Nak() // stopping: leave it to a running relay
			return
		}
		hctx, cancel := context.WithTimeout(context.WithoutCancel(rctx), handleTimeout)
		defer cancel()
		r.handle(hctx, m)
	}, r.log)
	if err := k.Start(ctx); err != nil {
		cancel()
		return err
	}
	r.cancel = cancel
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		stop := context.AfterFunc(ctx, cancel)
		defer stop()
		reconciling := make(chan struct{})
		go func() {
			defer close(reconciling)
			r.reconcileUntil(rctx)
		}()
		keepUntil(rctx, k)
		<-reconciling
		r.handling.Wait()
	}()
	return nil
}

// relayConsumerConfig is the durable consumer of fired ticks.
func relayConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       RelayConsumer,
		Description:   "Shared by every scheduler: fired schedule ticks, relayed to warden.submit.",
		FilterSubject: protocol.ScheduleTickSubject("*"),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       relayAckWait,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxAckPending: 256,
	}
}

// Stop stops consuming and waits until the handler in progress is done.
func (r *Relay) Stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	<-r.done
}

// Reconcile arms a timer for every schedule that has none of its current
// definition (a timer lost between a tick and its re-arming, a definition
// written by hand, an add or replace whose arming failed). Start runs it,
// and then every reconcileEvery.
//
// A schedule whose last tick fired less than r.quiet ago and may not be
// acknowledged yet (above the relay consumer's ack floor) is left alone:
// that tick is being relayed, and its relay arms the next timer after it.
// Armed here instead, the timer had no Warden-Schedule-After and could
// replace the relay's. Only that long: the ack floor is the consumer's, so
// one tick whose relaying keeps failing holds it down for every schedule
// that ticked after it. Each schedule is read again just before it is
// armed. One that cannot be armed does not stop the others.
func (r *Relay) Reconcile(ctx context.Context) error {
	entries, err := r.store.List(ctx)
	if err != nil && !errors.Is(err, ErrUndecodable) {
		return err
	}
	errs := []error{err} // the undecodable ones, if any: the others are armed
	acked := r.ackFloor(ctx)
	now, err := r.store.serverTime(ctx)
	if err != nil {
		return err
	}
	relaying := func(e Entry) bool { return e.tickSeq > acked && now.Sub(e.LastTick) < r.quiet }
	for _, e := range entries {
		if e.timerCurrent() || relaying(e) {
			continue
		}
		e, err := r.store.Get(ctx, e.Name)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err == nil && !e.timerCurrent() && !relaying(e) {
			err = r.armNow(ctx, e)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ackFloor is the stream sequence up to which the relays have acknowledged
// every tick: with no relay consumer (before the first start, or lost),
// every one; when it cannot be read, none.
func (r *Relay) ackFloor(ctx context.Context) uint64 {
	c, err := r.js.Consumer(ctx, streams.StreamSchedules, RelayConsumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return math.MaxUint64
	}
	if err != nil {
		return 0
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0
	}
	return info.AckFloor.Stream
}

// reconcileUntil runs Reconcile about every reconcileEvery (spread, so
// that the schedulers started together do not all read at once) until
// ctx ends.
func (r *Relay) reconcileUntil(ctx context.Context) {
	for {
		spread := time.Duration(rand.Int64N(int64(r.reconcileEvery)/5+1)) - r.reconcileEvery/10
		t := time.NewTimer(r.reconcileEvery + spread)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, reconcileTimeout)
		if err := r.Reconcile(rctx); err != nil && ctx.Err() == nil {
			r.log.Warn().Err(err).Msg("schedules not reconciled; tried again in a while")
		}
		cancel()
	}
}

// armNow arms the timer of e for its first tick after now (by the
// server's clock), unless e has been replaced or removed meanwhile.
func (r *Relay) armNow(ctx context.Context, e Entry) error {
	x, err := e.ValidateStored()
	if err != nil {
		r.log.Warn().Err(err).Str("schedule", e.Name).Msg("invalid schedule definition left alone")
		return nil
	}
	next, err := r.store.armNext(ctx, e.Name, e.Rev, x)
	switch {
	case errors.Is(err, errChanged):
		return nil // whoever changed it arms its own timer
	case err != nil:
		return err
	}
	r.log.Info().Str("schedule", e.Name).Time("next", next).Msg("armed a schedule that had no timer")
	return nil
}

// armCurrent arms the current definition of name if it has no timer. It
// follows an arm refused because the definition was replaced (or removed)
// while a tick of the old one was relayed: the writer of the new one arms
// its first timer itself, but may have died before it did.
func (r *Relay) armCurrent(ctx context.Context, name string) error {
	e, err := r.store.Get(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return nil // removed: nothing to arm
	}
	if err != nil {
		return err
	}
	return r.armIfNone(ctx, e)
}

// armIfNone arms e's next tick unless e has a timer of its definition.
func (r *Relay) armIfNone(ctx context.Context, e Entry) error {
	if e.timerCurrent() {
		return nil
	}
	return r.armNow(ctx, e)
}

// handle relays one tick. Errors leave the tick unacked (nak with a delay)
// so that it is handled again; everything it does is idempotent.
func (r *Relay) handle(ctx context.Context, m jetstream.Msg) {
	name := strings.TrimPrefix(m.Subject(), protocol.ScheduleTickSubject(""))
	settle(m, r.relay(ctx, name, m.Headers()), r.log.With().Str("schedule", name).Logger(), "tick")
}

// settle acks a relayed message, or, when relaying it failed, hands it
// back to be redelivered in a second (every relay step is idempotent).
func settle(m jetstream.Msg, err error, log zerolog.Logger, what string) {
	if err != nil {
		log.Warn().Err(err).Str("subject", m.Subject()).Msg(what + " not relayed; it will be redelivered")
		_ = m.NakWithDelay(time.Second)
		return
	}
	_ = m.Ack()
}

func (r *Relay) relay(ctx context.Context, name string, h nats.Header) error {
	tick, err := time.Parse(time.RFC3339Nano, h.Get(protocol.HeaderScheduleTick))
	if err != nil {
		r.log.Warn().Str("schedule", name).Msg("tick without a valid Warden-Schedule-Tick header dropped")
		return nil
	}
	rev, _ := strconv.ParseUint(h.Get(protocol.HeaderScheduleRev), 10, 64)
	e, err := r.store.Get(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return nil // removed: the tick dies with it
	}
	if err != nil {
		return err
	}
	if e.Rev != rev {
		// Replaced: the tick dies, and the new definition has armed its
		// own timer, unless its writer died first.
		return r.armIfNone(ctx, e)
	}
	if e.timerRev == rev && !e.armedAfter.IsZero() && !tick.After(e.armedAfter) {
		// Relayed already: the timer armed after it is there. A relay
		// consumer created again (lost, restored) delivers every
		// schedule's last tick anew, and once that tick's job record had
		// expired it ran again.
		r.log.Debug().Str("schedule", name).Time("tick", tick).Msg("tick relayed already: dropped")
		return nil
	}
	x, err := e.ValidateStored()
	if err != nil {
		r.log.Warn().Err(err).Str("schedule", name).Msg("invalid schedule definition: tick dropped")
		return nil
	}
	// Lateness and the next tick by the server's clock, the one it fires
	// ticks by: this host's clock may be off by more than the grace.
	now, err := r.store.serverTime(ctx)
	if err != nil {
		return err
	}
	late := now.Sub(tick)
	overdue := late > e.grace(x, tick)
	job := JobID(name, tick)
	switch {
	case e.Paused:
		// Skipped, not missed: resuming does not catch it up. The next
		// tick is armed all the same, so that a paused schedule keeps a
		// timer, and its Resume finds one to replace.
		r.log.Debug().Str("schedule", name).Time("tick", tick).Msg("tick of a paused schedule skipped")
		// The first tick a pause skips is told on the event stream, so an
		// operator can tell a paused schedule from a broken one; one per
		// tick would flood it (an @every 1s schedule paused for a week:
		// 600,000 events pushing out the rest).
		if !tick.After(x.Next(e.PausedAt)) {
			r.event(ctx, protocol.EventScheduleSkipped, name, job, tick, late, "paused", e.PauseReason)
		}
	case overdue && e.Catchup == CatchupSkip:
		r.log.Info().Str("schedule", name).Time("tick", tick).Dur("late", late).Msg("overdue tick skipped (catchup: skip)")
		r.event(ctx, protocol.EventScheduleSkipped, name, job, tick, late, "overdue (catchup: skip)", "")
	default:
		if err := r.submit(ctx, e, job, tick); err != nil {
			return err
		}
		r.log.Debug().Str("schedule", name).Str(logging.FieldJob, job).Time("tick", tick).Dur("late", late).Msg("tick submitted")
		r.event(ctx, protocol.EventScheduleFired, name, job, tick, late, "", "")
	}
	err = arm(ctx, r.js, name, rev, x.Next(maxTime(tick, now)), tick)
	if errors.Is(err, errChanged) {
		// Replaced or removed while this tick was relayed: its timer is
		// the new definition's business, never this revision's.
		return r.armCurrent(ctx, name)
	}
	return err
}

// submit publishes the tick's job. The job id and Nats-Msg-Id are the
// tick's, so a second submission of the same tick makes no second job.
func (r *Relay) submit(ctx context.Context, e Entry, job string, tick time.Time) error {
	return submitJob(ctx, r.js, e.Definition, job, tick)
}

func (r *Relay) event(ctx context.Context, kind protocol.EventKind, name, job string, tick time.Time, late time.Duration,
	reason, pauseReason string) {
	ev := protocol.Event{Kind: kind, ID: job, JobID: job, Reason: reason, Data: map[string]string{
		"schedule": name, "tick": tick.UTC().Format(time.RFC3339Nano), "late": late.Round(time.Millisecond).String(),
	}}
	if pauseReason != "" {
		ev.Data["pause_reason"] = pauseReason
	}
	if err := r.events.Publish(ctx, ev); err != nil {
		r.log.Warn().Err(err).Str("schedule", name).Msg("schedule event not published")
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

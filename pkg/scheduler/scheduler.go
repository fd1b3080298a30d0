package scheduler

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/dispatch"
	"github.com/wardenhq/warden/pkg/events"
	"github.com/wardenhq/warden/pkg/health"
	"github.com/wardenhq/warden/pkg/jobstore"
	"github.com/wardenhq/warden/pkg/presence"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/retry"
	"github.com/wardenhq/warden/pkg/selection"
	"github.com/wardenhq/warden/streams"
)

// Scheduler is one scheduler process's worth of work.
type Scheduler struct {
	cfg      Config
	nc       *nats.Conn
	js       jetstream.JetStream
	log      zerolog.Logger
	metrics  Metrics
	now      func() time.Time
	store    *jobstore.Store
	view     *presence.View
	selector *selection.Selector
	events   *events.Publisher
	dispatch *dispatch.Dispatcher
	retry    retry.Config
}

// Option customises a Scheduler.
type Option func(*Scheduler)

// WithLogger sets the logger.
func WithLogger(l zerolog.Logger) Option { return func(s *Scheduler) { s.log = l } }

// WithMetrics sets the metrics sink.
func WithMetrics(m Metrics) Option { return func(s *Scheduler) { s.metrics = m } }

// WithClock sets the clock used for leases and timestamps.
func WithClock(now func() time.Time) Option { return func(s *Scheduler) { s.now = now } }

// New validates cfg and returns a scheduler using nc. Run starts it.
func New(cfg Config, nc *nats.Conn, opts ...Option) (*Scheduler, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("scheduler config: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	rc, err := cfg.loadRetry()
	if err != nil {
		return nil, fmt.Errorf("scheduler config: %w", err)
	}
	sel, err := selection.NewWithConfig(cfg.Selection)
	if err != nil {
		return nil, fmt.Errorf("scheduler config: selection: %w", err)
	}
	s := &Scheduler{cfg: cfg, retry: rc, nc: nc, js: js, log: zerolog.Nop(), metrics: NopMetrics{}, now: time.Now,
		selector: sel, events: events.NewPublisher(js)}
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// Run creates the streams, then consumes submissions and results until ctx
// ends. In-flight messages are finished before it returns.
func (s *Scheduler) Run(ctx context.Context) error {
	if err := streams.Ensure(ctx, s.js, s.cfg.streamOptions()); err != nil {
		return err
	}
	store, err := jobstore.Open(ctx, s.js)
	if err != nil {
		return err
	}
	s.store = store
	view, err := presence.NewView(ctx, s.js, s.log)
	if err != nil {
		return err
	}
	view.OnChange(func(c presence.Change) {
		if c.Gone {
			s.selector.Forget(c.Presence)
			return
		}
		s.selector.Observe(c.Presence)
	})
	s.view = view
	s.dispatch = dispatch.New(dispatch.Config{
		TaskShards:    s.cfg.TaskShards,
		DispatchGrace: s.cfg.DispatchGrace.Std(),
		StepDefaults: jobstore.StepDefaults{Timeout: s.cfg.DefaultStepTimeout.Std(), Retry: &s.retry.Policies,
			Expiry: s.cfg.DefaultTaskExpiry.Std()},
	}, s.js, store, view, s.selector, s.log, s.metrics, s.now)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg, feeders sync.WaitGroup
		workers     []chan work
		errc        = make(chan error, 3)
	)
	// stop shuts everything down in order: feeders first, so no message is
	// routed to a closed worker, then the workers finish what they hold.
	stop := func(err error) error {
		cancel()
		feeders.Wait()
		for _, ch := range workers {
			close(ch)
		}
		wg.Wait()
		return err
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := view.Run(ctx); err != nil {
			errc <- err
		}
	}()
	go func() {
		// Health assessments lower or exclude agents in selection; without
		// them (no supervisor yet) every agent counts as healthy.
		defer wg.Done()
		for ctx.Err() == nil {
			err := health.WatchRecords(ctx, s.js,
				func(r health.Record) { s.selector.SetHealth(r.Key(), r.Assessment) },
				s.selector.ClearHealth)
			if err != nil && ctx.Err() == nil {
				s.log.Warn().Err(err).Msg("health watch failed; retrying")
				select {
				case <-ctx.Done():
				case <-time.After(s.cfg.WaitRetry.Std()):
				}
			}
		}
	}()
	select {
	case <-view.Ready():
	case err := <-errc:
		return stop(err)
	case <-ctx.Done():
		return stop(nil)
	}

	workers = make([]chan work, s.cfg.Workers)
	for i := range workers {
		workers[i] = make(chan work, 64)
		wg.Add(1)
		go func(ch <-chan work) {
			defer wg.Done()
			for w := range ch {
				w.handle(ctx, w.msg)
			}
		}(workers[i])
	}
	for _, src := range []struct {
		stream string
		handle func(context.Context, jetstream.Msg)
		key    func(jetstream.Msg) string
	}{
		{protocol.StreamSubmit, s.handleSubmission, func(m jetstream.Msg) string { return m.Headers().Get(protocol.HeaderJobID) }},
		{protocol.StreamResults, s.handleResult, func(m jetstream.Msg) string { return m.Headers().Get(protocol.HeaderJob) }},
	} {
		cons, err := s.consumer(ctx, src.stream)
		if err != nil {
			return stop(err)
		}
		feeders.Add(1)
		go func() {
			defer feeders.Done()
			if err := s.feed(ctx, cons, workers, src.handle, src.key); err != nil {
				errc <- err
			}
		}()
	}
	ctrl, err := s.nc.QueueSubscribe(protocol.SubjectControlAdvance, protocol.ConsumerScheduler, func(m *nats.Msg) {
		s.handleAdvanceRequest(ctx, m)
	})
	if err != nil {
		return stop(fmt.Errorf("subscribe %s: %w", protocol.SubjectControlAdvance, err))
	}
	defer func() { _ = ctrl.Unsubscribe() }()
	s.log.Info().Int("workers", s.cfg.Workers).Int("task_shards", s.cfg.TaskShards).Msg("scheduler running")

	select {
	case <-ctx.Done():
		return stop(nil)
	case err := <-errc:
		return stop(err)
	}
}

type work struct {
	msg    jetstream.Msg
	handle func(context.Context, jetstream.Msg)
}

func (s *Scheduler) consumer(ctx context.Context, stream string) (jetstream.Consumer, error) {
	cfg, err := streams.SchedulerConsumer()
	if err != nil {
		return nil, err
	}
	cons, err := s.js.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: %w", cfg.Durable, stream, err)
	}
	return cons, nil
}

// feed pulls messages and routes each to the worker owning its job, so one
// scheduler never races itself on a job.
func (s *Scheduler) feed(ctx context.Context, cons jetstream.Consumer, workers []chan work,
	handle func(context.Context, jetstream.Msg), key func(jetstream.Msg) string) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(2 * len(workers)))
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	go func() {
		<-ctx.Done()
		it.Stop()
	}()
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				return nil
			}
			s.log.Warn().Err(err).Msg("pull failed; retrying")
			continue
		}
		h := fnv.New32a()
		_, _ = h.Write([]byte(key(msg)))
		select {
		case workers[h.Sum32()%uint32(len(workers))] <- work{msg: msg, handle: handle}:
		case <-ctx.Done():
			return nil
		}
	}
}

// settle acknowledges a handled message or hands it back.
func (s *Scheduler) settle(msg jetstream.Msg, err error, log zerolog.Logger) {
	switch {
	case err == nil:
		if aerr := msg.Ack(); aerr != nil {
			log.Warn().Err(aerr).Msg("ack failed; the message will be redelivered and handled again")
		}
	case errors.Is(err, dispatch.ErrWaiting):
		// The message comes back when the wait may be over: a retry's
		// backoff end (durable: the delay lives in the consumer, not in
		// this process), or soon for a step waiting for an agent.
		delay := s.cfg.WaitRetry.Std()
		if errors.Is(err, selection.ErrAtCapacity) {
			delay = s.cfg.CapacityRetry.Std()
		}
		var we *dispatch.WaitError
		if errors.As(err, &we) {
			delay = max(we.Until.Sub(s.now()), 10*time.Millisecond)
		}
		log.Debug().Err(err).Dur("retry_in", delay).Msg("job waiting")
		_ = msg.NakWithDelay(delay)
	default:
		log.Warn().Err(err).Msg("handling failed; will retry")
		_ = msg.NakWithDelay(s.cfg.WaitRetry.Std())
	}
}

// handleAdvanceRequest advances the job named in the request body at once
// (after an operator reopened a step, say) and replies "ok" or the error.
func (s *Scheduler) handleAdvanceRequest(ctx context.Context, m *nats.Msg) {
	jobID := string(m.Data)
	reply := "ok"
	if !protocol.ValidToken(jobID) {
		reply = "error: invalid job id"
	} else if err := s.dispatch.Advance(ctx, jobID); err != nil && !errors.Is(err, dispatch.ErrWaiting) {
		reply = "error: " + err.Error()
	}
	_ = m.Respond([]byte(reply))
}

package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/internal/retry"
	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/internal/selection"
	"github.com/wardenhq/warden/pkg/protocol"
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
	router   *cluster.Router // routes steps addressed to an agent cluster
	selector *selection.Selector
	retry    retry.Config
	workers  []*worker

	// unknownLimitGrace: WithUnknownLimitGrace.
	unknownLimitGrace time.Duration

	// clusterTurn rotates ties among active-active cluster members.
	clusterTurn atomic.Uint32
	gates       gates   // concurrency keys and rate limits (workflow.go)
	backlog     backlog // steps waiting for capacity, by priority (priority.go)
	holds       *holds  // messages held for waiting jobs, by partition (holds.go)
}

// Option customises a Scheduler.
type Option func(*Scheduler)

// WithLogger sets the logger.
func WithLogger(l zerolog.Logger) Option { return func(s *Scheduler) { s.log = l } }

// WithMetrics sets the metrics sink.
func WithMetrics(m Metrics) Option { return func(s *Scheduler) { s.metrics = m } }

// WithUnknownLimitGrace sets how long a step waits on a rate limit the
// scheduler does not define before it fails. Defaults to
// DefaultUnknownLimitGrace.
func WithUnknownLimitGrace(d time.Duration) Option {
	return func(s *Scheduler) { s.unknownLimitGrace = d }
}

// WithClock sets the clock used for leases and timestamps.
func WithClock(now func() time.Time) Option { return func(s *Scheduler) { s.now = now } }

// New validates cfg and returns a scheduler using nc. Run starts it.
func New(cfg Config, nc *nats.Conn, opts ...Option) (*Scheduler, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("scheduler config: %w", err)
	}
	// Many writes are in flight at once: every worker pipelines its turn.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(64*1024))
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
	h, err := newHolds(cfg.Partitions)
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	s := &Scheduler{cfg: cfg, retry: rc, nc: nc, js: js, log: zerolog.Nop(), metrics: NopMetrics{}, now: time.Now,
		selector: sel, holds: h, unknownLimitGrace: DefaultUnknownLimitGrace}
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// Run creates the streams, then consumes submissions and results until ctx
// ends. In-flight messages are finished before it returns. It returns nil
// when ctx ends, even while it is still starting (as an agent's Run does).
func (s *Scheduler) Run(ctx context.Context) (err error) {
	defer func(parent context.Context) {
		if err != nil && parent.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			err = nil // stopped while starting: a shutdown, not a failure
		}
	}(ctx) // ctx is replaced below by one this Run cancels itself
	if err := streams.Ensure(ctx, s.js, s.cfg.streamOptions()); err != nil {
		return err
	}
	store, err := jobstore.Open(ctx, s.js, jobstore.WithRetention(s.cfg.Retention.Std()))
	if err != nil {
		return err
	}
	s.store = store
	// The workers exist before anything can route to them or wake them:
	// the gate_freed subscription (openGates) and the router's and the
	// presence view's callbacks. A gate_freed that came while they did not
	// divided by zero workers and crashed the process.
	s.workers = make([]*worker, s.cfg.Workers)
	for i := range s.workers {
		s.workers[i] = newWorker(s)
	}
	ops.ServeMicro(ctx, s.nc, ops.ServiceScheduler, s.log) // nats micro ls: warden-scheduler (operator's edit)
	if err := s.openGates(ctx); err != nil {
		return err
	}
	defer s.closeGates()
	view, err := presence.NewView(ctx, s.js, s.log, presence.WithTaskShards(s.cfg.TaskShards), presence.WithEvents(events.NewPublisher(s.js)))
	if err != nil {
		return err
	}
	view.Feed(s.selector) // the selector indexes every presence, initial state included
	s.view = view
	router, err := cluster.NewRouter(ctx, s.js, s.log)
	if err != nil {
		return err
	}
	s.router = router
	router.OnChange(s.wakeAll) // a new leader or owner may take a waiting step
	// An agent that appears or changes may take a waiting step.
	view.OnChange(func(c presence.Change) {
		if !c.Gone {
			s.wakeAll()
		}
	})

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		bg, workers sync.WaitGroup
		errc        = make(chan error, 4)
	)
	bg.Add(4)
	go func() {
		defer bg.Done()
		// Delayed submissions the server released (WARDEN_DELAY), submitted
		// again; every scheduler runs one on a shared consumer.
		for ctx.Err() == nil {
			if err := schedule.RunDelayRelay(ctx, s.js, s.log); err != nil && ctx.Err() == nil {
				s.log.Warn().Err(err).Msg("delay relay stopped; restarting")
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}
	}()
	go func() {
		defer bg.Done()
		for ctx.Err() == nil {
			if err := router.Run(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn().Err(err).Msg("cluster state watch broke; restarting")
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}
	}()
	go func() {
		defer bg.Done()
		if err := view.Run(ctx); err != nil {
			errc <- err
		}
	}()
	go func() {
		defer bg.Done()
		s.watchHealth(ctx)
	}()
	stop := func(err error) error {
		cancel()
		workers.Wait()
		bg.Wait()
		return err
	}
	select {
	case <-view.Ready():
	case err := <-errc:
		return stop(err)
	case <-ctx.Done():
		return stop(nil)
	}
	// Workers finish the turn they hold after ctx ends; the consumers stop
	// first (stop cancels ctx, the consume contexts are drained below).
	wctx, wcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer wcancel()
	for _, w := range s.workers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			w.run(wctx)
		}()
	}
	stopWorkers := func(err error) error {
		cancel()
		wcancel()
		workers.Wait()
		bg.Wait()
		return err
	}
	// Answer advance requests before taking inputs: an operator's cancel
	// right after start must reach a scheduler that may already dispatch.
	ctrl, err := s.nc.QueueSubscribe(protocol.SubjectControlAdvance, protocol.ConsumerScheduler, func(m *nats.Msg) {
		if m.Reply != "" && !protocol.ValidReplySubject(m.Reply) {
			// Answered there, the reply (which the scheduler's response
			// permission lets through wherever the requester points it)
			// would be a write to that subject: a job record, a lease. The
			// advance is still made; nobody is answered.
			m.Reply = ""
		}
		jobID := string(m.Data)
		if !protocol.ValidToken(jobID) {
			_ = m.Respond(protocol.ErrorReply(protocol.CodeInvalidRequest, fmt.Errorf("invalid job id %q", jobID)))
			return
		}
		s.route(input{kind: inAdvance, job: jobID, req: m, at: s.now()})
	})
	if err != nil {
		return stopWorkers(fmt.Errorf("subscribe %s: %w", protocol.SubjectControlAdvance, err))
	}
	defer func() { _ = ctrl.Unsubscribe() }()
	consumers, err := s.consume(ctx, &bg)
	defer func() {
		for _, k := range consumers {
			k.Drain()
		}
	}()
	if err != nil {
		if ctx.Err() != nil {
			err = nil // stopped while starting: not a failure
		}
		return stopWorkers(err)
	}
	s.log.Info().Int("workers", s.cfg.Workers).Int("partitions", s.cfg.Partitions).Int("task_shards", s.cfg.TaskShards).
		Msg("scheduler running")
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	for _, k := range consumers {
		k.Drain()
	}
	return stopWorkers(err)
}

func (s *Scheduler) onSubmission(m jetstream.Msg) {
	// An id that is not a token is kept as it came, to be refused
	// (parseSubmission: invalid_id). Replaced by a placeholder, it named
	// a valid job: the first such submission created job "invalid", and
	// every later one, whoever sent it, was answered existing:true and its
	// spec dropped without a word.
	in := input{kind: inSubmit, job: submissionJobID(m, s.cfg.limitsFor(m.Headers())), msg: m, at: s.now()}
	s.arrived(&in) // under a backlog, its priority counts from now (priority.go)
	s.route(in)
}

func (s *Scheduler) onResult(m jetstream.Msg) {
	// As for submissions, the job is kept as the subject names it: a
	// result for an id that is not a token is refused (prepare). Routed as
	// "unknown", it was judged against a job of that name, and applied to
	// it when its step, epoch and token fitted.
	job, _ := resultRoute(m.Subject())
	s.route(input{kind: inResult, job: job, msg: m, at: s.now()})
}

// route hands an input to the worker owning its job.
func (s *Scheduler) route(in input) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(in.job))
	s.workers[h.Sum32()%uint32(len(s.workers))].q.push(in)
}

// wakeAll retries the steps waiting for an agent or a slot, at most once
// per wakeEvery per worker.
func (s *Scheduler) wakeAll() {
	now := time.Now().UnixNano()
	for _, w := range s.workers {
		w.wake(now)
	}
}

func (s *Scheduler) watchHealth(ctx context.Context) {
	// Health assessments lower or exclude agents in selection; without
	// them (no supervisor yet) every agent counts as healthy.
	for ctx.Err() == nil {
		err := health.WatchRecords(ctx, s.js,
			func(r health.Record) { s.selector.SetHealth(r.Key(), r.Assessment) },
			s.selector.ClearHealth)
		if err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("health watch failed; retrying")
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// eventMsg encodes an event for WARDEN_EVENTS with a dedup id derived from
// what it describes.
func (s *Scheduler) eventMsg(e outEvent) (*nats.Msg, error) {
	if e.Time.IsZero() {
		e.Time = s.now().UTC()
	}
	b, err := json.Marshal(e.Event)
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(protocol.EventSubject(e.Kind, e.ID))
	m.Data = b
	if e.dedup != "" {
		m.Header.Set(protocol.HeaderMsgID, string(e.Kind)+"."+e.ID+"."+e.dedup)
	}
	return m, nil
}

// outEvent is an event to publish with its dedup key. write is the record
// whose change it reports, as in count: it is published if that write
// landed, even when another write of the turn lost (the retry finds the
// change made and would not report it); noWrite, if the turn's writes
// all landed.
type outEvent struct {
	protocol.Event
	dedup string
	write int
}

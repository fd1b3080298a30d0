// Package dispatch moves jobs forward: it skips steps that can no longer
// run, places ready steps on agents and records the job state the steps
// imply. Schedulers call it after every submission and result; the
// supervisor leader calls it to recover what a dead scheduler left behind.
//
// Every write is a CAS on the job store, so concurrent callers on the same
// job are safe: a step is dispatched once per epoch, and the epoch, actor
// and lease are written before the task is published.
package dispatch

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/events"
	"github.com/wardenhq/warden/pkg/jobstore"
	"github.com/wardenhq/warden/pkg/presence"
	"github.com/wardenhq/warden/pkg/selection"
)

// ErrWaiting says a ready step found no agent; the caller should try again
// later (schedulers redeliver the message that triggered the advance).
var ErrWaiting = errors.New("waiting for an agent")

// WaitError says the job has a retry waiting for its backoff until Until;
// it matches ErrWaiting. The caller comes back then.
type WaitError struct{ Until time.Time }

func (e *WaitError) Error() string {
	return "retry waiting for its backoff until " + e.Until.UTC().Format(time.RFC3339Nano)
}

// Is makes errors.Is(err, ErrWaiting) true.
func (e *WaitError) Is(target error) bool { return target == ErrWaiting }

// Config is what dispatching needs to know.
type Config struct {
	// TaskShards is the number of task streams.
	TaskShards int
	// DispatchGrace is added to a step's timeout to form its lease.
	DispatchGrace time.Duration
	// StepDefaults fill what specs leave out when steps are materialised.
	StepDefaults jobstore.StepDefaults
}

// Metrics is what dispatching counts.
type Metrics interface {
	StepDispatched()
	JobFinished(state string)
}

type nopMetrics struct{}

func (nopMetrics) StepDispatched()    {}
func (nopMetrics) JobFinished(string) {}

// Dispatcher advances jobs.
type Dispatcher struct {
	cfg      Config
	js       jetstream.JetStream
	store    *jobstore.Store
	view     *presence.View
	selector *selection.Selector
	events   *events.Publisher
	log      zerolog.Logger
	metrics  Metrics
	now      func() time.Time
}

// New returns a dispatcher choosing agents from view.
func New(cfg Config, js jetstream.JetStream, store *jobstore.Store, view *presence.View, sel *selection.Selector,
	log zerolog.Logger, m Metrics, now func() time.Time) *Dispatcher {
	if m == nil {
		m = nopMetrics{}
	}
	if now == nil {
		now = time.Now
	}
	return &Dispatcher{cfg: cfg, js: js, store: store, view: view, selector: sel,
		events: events.NewPublisher(js), log: log, metrics: m, now: now}
}

// Materialise writes every step record of job that is missing.
func (s *Dispatcher) Materialise(ctx context.Context, job *jobstore.Job) error {
	steps, err := jobstore.NewSteps(job.ID, job.Spec, s.cfg.StepDefaults, job.CreatedAt)
	if err != nil {
		return err
	}
	for _, st := range steps {
		if _, err := s.store.CreateStep(ctx, st); err != nil && !errors.Is(err, jobstore.ErrExists) {
			return err
		}
	}
	return nil
}

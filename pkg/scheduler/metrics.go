package scheduler

import "github.com/prometheus/client_golang/prometheus"

// Metrics is what the scheduler counts. NewMetrics registers Prometheus
// collectors; NopMetrics counts nothing.
type Metrics interface {
	JobAccepted()
	SubmissionRejected(reason string)
	StepDispatched()
	ResultApplied(status string)
	StaleResult()
	JobFinished(state string)
}

// NopMetrics discards everything.
type NopMetrics struct{}

func (NopMetrics) JobAccepted()              {}
func (NopMetrics) SubmissionRejected(string) {}
func (NopMetrics) StepDispatched()           {}
func (NopMetrics) ResultApplied(string)      {}
func (NopMetrics) StaleResult()              {}
func (NopMetrics) JobFinished(string)        {}

type promMetrics struct {
	accepted   prometheus.Counter
	rejected   *prometheus.CounterVec
	dispatched prometheus.Counter
	results    *prometheus.CounterVec
	stale      prometheus.Counter
	finished   *prometheus.CounterVec
}

// NewMetrics creates the scheduler's collectors and registers them with r.
func NewMetrics(r prometheus.Registerer) Metrics {
	m := &promMetrics{
		accepted:   prometheus.NewCounter(prometheus.CounterOpts{Name: "warden_jobs_accepted_total", Help: "Jobs materialised from submissions."}),
		rejected:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warden_submissions_rejected_total", Help: "Submissions rejected, by reason."}, []string{"reason"}),
		dispatched: prometheus.NewCounter(prometheus.CounterOpts{Name: "warden_steps_dispatched_total", Help: "Step dispatches (each a new epoch)."}),
		results:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warden_results_applied_total", Help: "Results applied to steps, by status."}, []string{"status"}),
		stale:      prometheus.NewCounter(prometheus.CounterOpts{Name: "warden_results_stale_total", Help: "Results dropped because their epoch was not the step's."}),
		finished:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warden_jobs_finished_total", Help: "Jobs that reached a terminal state, by state."}, []string{"state"}),
	}
	r.MustRegister(m.accepted, m.rejected, m.dispatched, m.results, m.stale, m.finished)
	return m
}

func (m *promMetrics) JobAccepted()                { m.accepted.Inc() }
func (m *promMetrics) SubmissionRejected(r string) { m.rejected.WithLabelValues(r).Inc() }
func (m *promMetrics) StepDispatched()             { m.dispatched.Inc() }
func (m *promMetrics) ResultApplied(s string)      { m.results.WithLabelValues(s).Inc() }
func (m *promMetrics) StaleResult()                { m.stale.Inc() }
func (m *promMetrics) JobFinished(s string)        { m.finished.WithLabelValues(s).Inc() }

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
	ResultRejected(reason string)
	JobFinished(state string)
	// JobTimedOut counts jobs whose timeout ran out (they then end failed
	// or compensate).
	JobTimedOut()
	// WaitingSteps is the queue depth by priority: steps of this
	// scheduler waiting for agent capacity.
	WaitingSteps(priority string, n int)
}

// NopMetrics discards everything.
type NopMetrics struct{}

func (NopMetrics) JobAccepted()              {}
func (NopMetrics) SubmissionRejected(string) {}
func (NopMetrics) StepDispatched()           {}
func (NopMetrics) ResultApplied(string)      {}
func (NopMetrics) StaleResult()              {}
func (NopMetrics) ResultRejected(string)     {}
func (NopMetrics) JobFinished(string)        {}
func (NopMetrics) JobTimedOut()              {}
func (NopMetrics) WaitingSteps(string, int)  {}

type promMetrics struct {
	accepted   prometheus.Counter
	rejected   *prometheus.CounterVec
	dispatched prometheus.Counter
	results    *prometheus.CounterVec
	stale      prometheus.Counter
	refused    *prometheus.CounterVec
	finished   *prometheus.CounterVec
	timedOut   prometheus.Counter
	waiting    *prometheus.GaugeVec
}

// NewMetrics creates the scheduler's collectors and registers them with r.
func NewMetrics(r prometheus.Registerer) Metrics {
	m := &promMetrics{
		accepted:   prometheus.NewCounter(prometheus.CounterOpts{Name: "warden_jobs_accepted_total", Help: "Jobs materialised from submissions."}),
		rejected:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warden_submissions_rejected_total", Help: "Submissions rejected, by reason."}, []string{"reason"}),
		dispatched: prometheus.NewCounter(prometheus.CounterOpts{Name: "warden_steps_dispatched_total", Help: "Step dispatches (each a new epoch)."}),
		results:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warden_results_applied_total", Help: "Results applied to steps, by status."}, []string{"status"}),
		stale:      prometheus.NewCounter(prometheus.CounterOpts{Name: "warden_results_stale_total", Help: "Results dropped because their epoch was not the step's."}),
		refused:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warden_results_rejected_total", Help: "Results refused (wrong agent, token, subject; unknown job or step; undecodable), by reason."}, []string{"reason"}),
		finished:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warden_jobs_finished_total", Help: "Jobs that reached a terminal state, by state."}, []string{"state"}),
		timedOut:   prometheus.NewCounter(prometheus.CounterOpts{Name: "warden_jobs_timed_out_total", Help: "Jobs whose timeout ran out: cancelled, to end failed (or compensated)."}),
	}
	m.waiting = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "warden_steps_waiting", Help: "Steps waiting for agent capacity in this scheduler, by priority (queue depth)."}, []string{"priority"})
	r.MustRegister(m.accepted, m.rejected, m.dispatched, m.results, m.stale, m.refused, m.finished, m.timedOut, m.waiting)
	return m
}

func (m *promMetrics) JobAccepted()                 { m.accepted.Inc() }
func (m *promMetrics) SubmissionRejected(r string)  { m.rejected.WithLabelValues(r).Inc() }
func (m *promMetrics) StepDispatched()              { m.dispatched.Inc() }
func (m *promMetrics) ResultApplied(s string)       { m.results.WithLabelValues(s).Inc() }
func (m *promMetrics) StaleResult()                 { m.stale.Inc() }
func (m *promMetrics) ResultRejected(reason string) { m.refused.WithLabelValues(reason).Inc() }
func (m *promMetrics) JobFinished(s string)         { m.finished.WithLabelValues(s).Inc() }
func (m *promMetrics) JobTimedOut()                 { m.timedOut.Inc() }
func (m *promMetrics) WaitingSteps(p string, n int) { m.waiting.WithLabelValues(p).Set(float64(n)) }

package supervisor

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the supervisor's Prometheus collectors.
type Metrics struct {
	leader       prometheus.Gauge
	recovered    *prometheus.CounterVec
	failovers    *prometheus.CounterVec
	transferred  prometheus.Counter
	deadLettered *prometheus.CounterVec
	// transferRetries counts moved cluster steps moved again because no
	// member took them up within task_transfer_timeout (transfer.go).
	transferRetries *prometheus.CounterVec
	healingCycle    prometheus.Histogram
}

// NewMetrics creates the collectors and registers them with r (nil: none).
func NewMetrics(r prometheus.Registerer) *Metrics {
	m := &Metrics{
		leader:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "warden_supervisor_leader", Help: "1 while this supervisor leads."}),
		recovered:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warden_steps_recovered_total", Help: "Steps taken back from their agent, by why."}, []string{"why"}),
		failovers:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warden_failovers_total", Help: "Agent failovers, by outcome."}, []string{"outcome"}),
		transferred:  prometheus.NewCounter(prometheus.CounterOpts{Name: "warden_tasks_transferred_total", Help: "Tasks moved off failed agents."}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warden_dead_letters_total", Help: "Tasks moved to the dead-letter stream, by reason."}, []string{"reason"}),
		transferRetries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warden_cluster_transfer_retries_total",
			Help: "Steps moved off a failed cluster member and moved again: not taken up within task_transfer_timeout."}, []string{"cluster"}),
		healingCycle: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "warden_healing_cycle_duration_seconds", Help: "How long one self-healing cycle (assess every agent, act) took.", Buckets: prometheus.ExponentialBuckets(0.0005, 3, 10)}),
	}
	if r != nil {
		r.MustRegister(m.leader, m.recovered, m.failovers, m.transferred, m.deadLettered, m.transferRetries, m.healingCycle)
	}
	return m
}

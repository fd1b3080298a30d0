package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// MetricsHandler serves the agent's counters in the Prometheus text format.
// It is written by hand so the agent SDK does not pull in a metrics library.
func (a *Agent) MetricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s := a.Stats()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		labels := fmt.Sprintf(`agent=%q,pool=%q`, a.cfg.ID, a.cfg.Pool)
		for _, m := range []struct {
			name, kind, help string
			value            float64
		}{
			{"warden_agent_tasks_in_flight", "gauge", "Tasks held now, running or being settled.", float64(s.InFlight)},
			{"warden_agent_handlers_abandoned", "gauge", "Handlers that ignored cancellation and still run, each holding its slot.", float64(s.Abandoned)},
			{"warden_agent_max_concurrent", "gauge", "Configured max_concurrent.", float64(a.cfg.MaxConcurrent)},
			{"warden_agent_concurrency_limit", "gauge", "Tasks the agent runs at once now: max_concurrent, or less after a limit request (self-healing's reduce_load); the heartbeat's max_concurrent.", float64(a.limit.Load())},
			{"warden_agent_results_succeeded_total", "counter", "Results reported as succeeded.", float64(s.Succeeded)},
			{"warden_agent_results_failed_total", "counter", "Results reported as failed.", float64(s.Failed)},
			{"warden_agent_lease_lost_total", "counter", "Tasks abandoned because the lease was not confirmed.", float64(s.LeaseLost)},
			{"warden_agent_tasks_rejected_total", "counter", "Task messages that could not be decoded.", float64(s.Rejected)},
			{"warden_agent_tasks_expired_total", "counter", "Tasks not run or not reported because their deadline passed.", float64(s.Expired)},
			{"warden_agent_tasks_handed_back_total", "counter", "Tasks handed back at shutdown.", float64(s.HandedBack)},
			{"warden_agent_tasks_reported_again_total", "counter", "Deliveries of a task whose result was already stored here: acked unrun, the result published again.", float64(s.ReportedAgain)},
			{"warden_agent_draining", "gauge", "1 while the agent takes no new tasks: shutting down, or drained by an operator or self-healing (as its heartbeat says).", boolFloat(a.draining.Load() || a.held.Load())},
		} {
			fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s{%s} %g\n", m.name, m.help, m.name, m.kind, m.name, labels, m.value)
		}
	})
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// serveMetrics serves /metrics on MetricsAddr until the returned stop is
// called. A port that cannot be bound is logged, not fatal: metrics are
// not worth refusing work for.
func (a *Agent) serveMetrics(ctx context.Context) (stop func()) {
	if a.cfg.MetricsAddr == "" {
		return func() {}
	}
	ln, err := net.Listen("tcp", a.cfg.MetricsAddr)
	if err != nil {
		a.log.Error().Err(err).Str("metrics_addr", a.cfg.MetricsAddr).Msg("metrics disabled")
		return func() {}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", a.MetricsHandler())
	// /healthz: the process serves; /readyz: it is connected to NATS (operator's edit).
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if nc := a.nc; nc == nil || !nc.IsConnected() {
			http.Error(w, "not ready: nats not connected", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error().Err(err).Msg("metrics server")
		}
	}()
	a.log.Info().Str("metrics_addr", ln.Addr().String()).Msg("serving /metrics")
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}
}

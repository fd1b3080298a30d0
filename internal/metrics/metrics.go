package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewRegistry returns a registry with the Go and process collectors.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// Check is a readiness check: nil when ready.
type Check func() error

// Handle serves g on mux at /metrics.
func Handle(mux *http.ServeMux, g prometheus.Gatherer) {
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
}

// Health serves /healthz (200 while the process serves) and /readyz (200
// when every check passes, 503 with the first failure otherwise) on mux.
func Health(mux *http.ServeMux, checks ...Check) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		for _, c := range checks {
			if c == nil {
				continue
			}
			if err := c(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte("not ready: " + err.Error() + "\n"))
				return
			}
		}
		_, _ = w.Write([]byte("ready\n"))
	})
}

// Serve serves /metrics, /healthz and /readyz on addr until ctx ends. An
// empty addr serves nothing. It returns the address actually bound (useful
// with port 0).
func Serve(ctx context.Context, addr string, g prometheus.Gatherer, checks ...Check) (string, error) {
	if addr == "" {
		return "", nil
	}
	mux := http.NewServeMux()
	Handle(mux, g)
	Health(mux, checks...)
	return ListenAndServe(ctx, addr, mux)
}

// ListenAndServe serves h on addr until ctx ends and returns the address it
// is bound to (addr may ask for port 0).
func ListenAndServe(ctx context.Context, addr string, h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // the listener is gone; these endpoints are best effort
		}
	}()
	return ln.Addr().String(), nil
}

// Connected is a readiness check: ready while nc is connected to NATS.
func Connected(nc *nats.Conn) Check {
	return func() error {
		if nc == nil || !nc.IsConnected() {
			return errors.New("nats not connected")
		}
		return nil
	}
}

package daemon

import (
	"context"
	"net/http"
	"net/http/pprof"
	"runtime/debug"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/metrics"
)

// setGCPercent applies a process's gc_percent unless the operator set GOGC,
// which the Go runtime has already applied and which wins.
func setGCPercent(percent int, env func(string) (string, bool), log zerolog.Logger) {
	if percent == 0 {
		return
	}
	if v, ok := env("GOGC"); ok && v != "" {
		log.Debug().Str("GOGC", v).Int("gc_percent", percent).Msg("GOGC set: gc_percent ignored")
		return
	}
	if v, _ := env("GOMEMLIMIT"); percent < 0 && v == "" {
		log.Warn().Int("gc_percent", percent).Msg("garbage collection is off and GOMEMLIMIT is not set: the heap grows without bound")
	}
	debug.SetGCPercent(percent)
}

// servePprof serves net/http/pprof on its own listener, never on the
// metrics port, which is often reachable from outside, until ctx ends. The
// command line is left out: it may carry a server URL with credentials.
func servePprof(ctx context.Context, addr string) (string, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return metrics.ListenAndServe(ctx, addr, mux)
}

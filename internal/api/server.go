package api

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/metrics"
	"github.com/wardenhq/warden/internal/ops"
)

// Server serves the API, the dashboard, /metrics, /healthz and /readyz.
type Server struct {
	cfg  Config
	ops  *ops.Ops
	nc   *nats.Conn
	log  zerolog.Logger
	keys keyring
	reg  prometheus.Gatherer
	mux  *http.ServeMux
	// handler is mux behind the cross-origin protection.
	handler http.Handler
	// closing ends when Run's shutdown starts: event streams stop then.
	closing context.Context
	// streams counts the event streams being served (maxStreams).
	streams atomic.Int64
	// now is the clock, replaced in tests.
	now func() time.Time
	// idleTimeout closes a keep-alive connection idle this long
	// (defaultIdleTimeout; tests shorten it).
	idleTimeout time.Duration
}

// defaultIdleTimeout is how long Run keeps an idle keep-alive connection.
const defaultIdleTimeout = 2 * time.Minute

// Option configures a Server.
type Option func(*Server)

// WithLogger sets the logger. Defaults to none.
func WithLogger(l zerolog.Logger) Option { return func(s *Server) { s.log = l } }

// WithGatherer serves g on /metrics, to the read scope. Defaults to
// nothing on /metrics.
func WithGatherer(g prometheus.Gatherer) Option { return func(s *Server) { s.reg = g } }

// New builds a server over the facade o, which runs on nc.
func New(cfg Config, nc *nats.Conn, o *ops.Ops, opts ...Option) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	keys, err := loadTokens(cfg.Tokens)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, ops: o, nc: nc, log: zerolog.Nop(), keys: keys, now: time.Now, idleTimeout: defaultIdleTimeout}
	for _, opt := range opts {
		opt(s)
	}
	s.mux = http.NewServeMux()
	for _, rt := range s.routes() {
		s.mux.Handle(rt.Method+" "+rt.Path, s.wrap(rt))
	}
	metrics.Health(s.mux, s.ready)
	if s.reg != nil {
		// Read scope, as every read route: a scrape reads the presence
		// and health buckets and the streams' infos, which nobody
		// without a token (nor a page under a rebound DNS name) may
		// make the API do. Prometheus sends a bearer token
		// (authorization: {credentials_file: ...} in its scrape config).
		prom := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
		s.mux.Handle("GET /metrics", s.wrap(route{Method: "GET", Path: "/metrics", Scope: ScopeRead,
			h: func(w http.ResponseWriter, r *http.Request) error { prom.ServeHTTP(w, r); return nil }}))
	}
	if *cfg.Dashboard {
		s.mux.Handle("/", dashboard())
	}
	// Anything else under /api/ is a JSON 404, not the dashboard.
	s.mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		if allow := s.allowed(r); len(allow) > 0 {
			// A known path asked with another method: this catch-all
			// matched it first, so the mux's own 405 never came.
			if r.ContentLength != 0 {
				w.Header().Set("Connection", "close")
			}
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeJSON(w, http.StatusMethodNotAllowed, ErrorBody{Error: ErrorDetail{Code: ops.CodeInvalid, Status: http.StatusMethodNotAllowed,
				Message: fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allow, ", "))}})
			return
		}
		refuse(w, r, ops.Errorf(ops.CodeNotFound, "no route %s %s", r.Method, r.URL.Path))
	})
	// A page on another site may send the browser's simple requests here
	// (a POST with a text/plain body needs no preflight): refused, so that
	// no web page can submit, cancel or drain through a developer's
	// anonymous loopback API. Clients that are not browsers send neither
	// Origin nor Sec-Fetch-Site and are not affected.
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refuse(w, r, ops.Errorf(ops.CodeForbidden, "cross-origin %s refused: call the API from its own origin, or with a bearer token from a program", r.Method))
	}))
	s.handler = s.bounded(cop.Handler(s.mux))
	return s, nil
}

// bounded gives every request's body until request_timeout and a margin to
// arrive, whoever answers it (the dashboard's files, a 404, a refusal before
// wrap): before it answers, net/http reads what is left of the body (up to
// 256 KiB), and with no deadline a client that promised a body and never
// sent it held the connection and its goroutine for good, with no token.
// wrap lifts it for an event stream.
func (s *Server) bounded(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.cfg.RequestTimeout + deadlineMargin))
		next.ServeHTTP(w, r)
	})
}

// allowed returns the methods the API serves r's path with, when r's is
// not one of them.
func (s *Server) allowed(r *http.Request) []string {
	var out []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		if m == r.Method {
			continue
		}
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "" && pattern != "/api/" && pattern != "/" {
			out = append(out, m)
		}
	}
	return out
}

// refuse answers a request refused before its body was read: the
// connection is closed after the answer, so the server does not wait for
// a body it will not use.
func refuse(w http.ResponseWriter, r *http.Request, err error) {
	if r.ContentLength != 0 {
		w.Header().Set("Connection", "close")
	}
	writeError(w, err)
}

// Handler is the server's whole HTTP surface.
func (s *Server) Handler() http.Handler { return s.handler }

// Run listens on Config.Listen and serves until ctx ends; ready (may be
// nil) receives the bound address.
func (s *Server) Run(ctx context.Context, ready func(addr string)) error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return err
	}
	// Requests run on a context that shutdown does not cancel: Shutdown
	// lets them finish (a submission the server stored is answered 201,
	// not turned into a 500 that a client retries into a second job).
	// Event streams never finish by themselves; they end when shutdown
	// starts (s.closing).
	closing, stopStreams := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStreams()
	s.closing = closing
	// A request still running when the shutdown's grace is about to end
	// is cut (errShuttingDown) in time to be answered: closed with the
	// connection, a failover that went through looked like no answer,
	// and a client asked again.
	base, cutAll := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cutAll(nil)
	// Every connection is bounded: an idle keep-alive one is closed
	// after idleTimeout, a response must be written within
	// request_timeout and two margins (the event stream moves its own
	// write deadline at each write), and bounded bounds reading a
	// request's body. No ReadTimeout: it would cancel an event stream's
	// context.
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       s.idleTimeout,
		WriteTimeout:      s.cfg.RequestTimeout + 2*deadlineMargin,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return base },
	}
	srv.RegisterOnShutdown(stopStreams)
	if ready != nil {
		ready(ln.Addr().String())
	}
	s.log.Info().Str("addr", "http://"+ln.Addr().String()).Msg("serving the API and dashboard")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	cut := time.AfterFunc(shutdownGrace-answerMargin, func() { cutAll(errShuttingDown) })
	defer cut.Stop()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// errShuttingDown is the cause of a request's context cut by the end of
// the shutdown's grace.
var errShuttingDown = errors.New("the API is shutting down")

// shutdownGrace is how long Run's shutdown lets requests in progress
// finish; it closes their connections then. answerMargin is what a request
// that waits into the grace (submitted) leaves of it to answer.
const (
	shutdownGrace = 5 * time.Second
	answerMargin  = time.Second
)

// deadlineMargin is what a request's connection deadlines leave past its
// request_timeout: its body must have arrived by then (a client sending
// slowly no longer holds the handler), and its response be written
// within another margin (Run's WriteTimeout).
const deadlineMargin = 5 * time.Second

// ready reports whether the API can serve: NATS connected.
func (s *Server) ready() error {
	if s.nc != nil && !s.nc.IsConnected() {
		return errors.New("nats: " + s.nc.Status().String())
	}
	return nil
}

// handler is a route's code: it writes a response or returns an error.
type handler func(w http.ResponseWriter, r *http.Request) error

// route is one API operation. The table in routes.go is the single list of
// routes: the mux, the auth checks and the OpenAPI test read it.
type route struct {
	Method, Path string
	// Scope is what the caller needs; ScopeNone: public.
	Scope Scope
	// Stream marks long-lived responses (no request timeout).
	Stream bool
	h      handler
}

// wrap adds auth, the body limit, the request timeout and error mapping.
func (s *Server) wrap(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The request's own context: net/http cancels it when the client
		// goes away.
		connCtx := r.Context()
		if err := s.authorize(r, rt.Scope); err != nil {
			refuse(w, r, err)
			return
		}
		if r.ContentLength > s.cfg.MaxBodyBytes {
			refuse(w, r, ops.Errorf(ops.CodeTooLarge, "request body of %d bytes exceeds the limit of %d", r.ContentLength, s.cfg.MaxBodyBytes))
			return
		}
		if rt.Stream && r.ContentLength != 0 {
			// Its read deadline is lifted below: a body it promised
			// and never sent would hold the connection for good.
			refuse(w, r, ops.Errorf(ops.CodeInvalid, "%s takes no request body", rt.Path))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
		if !rt.Stream {
			// Its body must arrive by bounded's read deadline, just after
			// this one: work cut by the deadline ends on its timeout, not
			// on the read's cancel of the connection's context.
			ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
			defer cancel()
			r = r.WithContext(ctx)
		} else {
			// A read deadline would end the stream's context (net/http
			// reads the connection to notice the client leaving).
			_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
			if s.closing != nil {
				ctx, cancel := context.WithCancel(r.Context())
				defer cancel()
				stop := context.AfterFunc(s.closing, cancel)
				defer stop()
				r = r.WithContext(ctx)
			}
		}
		if err := rt.h(w, r); err != nil {
			if errors.Is(context.Cause(r.Context()), errShuttingDown) {
				writeError(w, &ops.Error{Code: ops.CodeTimeout, Err: err,
					Msg: "the API is shutting down and cut this request: it may have been carried out; look before asking again"})
				return
			}
			if errors.Is(err, context.Canceled) && connCtx.Err() != nil {
				// The client went away (or its connection's read deadline
				// passed): not the API failing, nothing to log. The
				// answer, if anyone reads it, is a timeout, not a 500.
				s.log.Debug().Err(err).Str("method", r.Method).Str("path", r.URL.Path).Msg("request cancelled: its connection ended")
				writeError(w, &ops.Error{Code: ops.CodeTimeout, Msg: "request cancelled: its connection ended", Err: err})
				return
			}
			if c := ops.CodeOf(err); c == ops.CodeInternal || c == ops.CodeUnavailable {
				s.log.Warn().Err(err).Str("method", r.Method).Str("path", r.URL.Path).Msg("request failed")
			}
			writeError(w, err)
		}
	})
}

// authorize checks the bearer token against the route's scope.
func (s *Server) authorize(r *http.Request, need Scope) error {
	if need == ScopeNone {
		return nil
	}
	have := s.cfg.AnonymousScope
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
			return ops.Errorf(ops.CodeUnauthenticated, "authorization: want \"Bearer <token>\"")
		}
		t, ok := s.keys[sha256.Sum256([]byte(strings.TrimSpace(tok)))]
		if !ok {
			return ops.Errorf(ops.CodeUnauthenticated, "unknown token")
		}
		have = t.Scope
	} else if have == ScopeNone {
		return ops.Errorf(ops.CodeUnauthenticated, "a bearer token is required")
	} else if !s.anonymousHost(r.Host) {
		// DNS rebinding: a page whose own name resolves to this address
		// reads (and with admin, changes) what anonymous access allows,
		// the browser sending the page's name as Host.
		return ops.Errorf(ops.CodeForbidden, "anonymous access is served only under an IP address, localhost or anonymous_hosts, not %q: use a bearer token", r.Host)
	}
	if !have.allows(need) {
		return ops.Errorf(ops.CodeForbidden, "this token's scope (%s) does not allow %s operations", orNone(have), need)
	}
	return nil
}

// anonymousHost reports whether a request without a token may be served
// under host (the Host header): an IP address, localhost, or a name the
// config lists. A name chosen by someone else's DNS is not.
func (s *Server) anonymousHost(host string) bool {
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	h = strings.TrimSuffix(strings.Trim(h, "[]"), ".")
	if net.ParseIP(h) != nil || strings.EqualFold(h, "localhost") {
		return true
	}
	for _, a := range s.cfg.AnonymousHosts {
		if strings.EqualFold(a, h) {
			return true
		}
	}
	return false
}

func orNone(s Scope) string {
	if s == "" {
		return "anonymous"
	}
	return string(s)
}

// RouteInfo describes one route of the API.
type RouteInfo struct {
	Method, Path string
	Scope        Scope
}

// Routes lists the API's routes (for tests and docs).
func Routes() []RouteInfo {
	var out []RouteInfo
	for _, r := range (&Server{}).routes() {
		out = append(out, RouteInfo{r.Method, r.Path, r.Scope})
	}
	return out
}

package api_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/wardenhq/warden/internal/api"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/streams"
)

// /metrics was served outside the API's checks: without a token, and
// under any Host, so a page under a rebound DNS name read it and anyone
// made the API read presence, health and stream infos at will. It needs
// the read scope now, as every read route: a token, or anonymous read
// under a known host.
func TestMetricsNeedTheReadScope(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	nc, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{TaskShards: 1})
	st, err := jobstore.Open(ctx(t), js)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "warden_test_scrapes_total"})
	reg.MustRegister(c)
	c.Inc()
	start := func(cfg api.Config) bundle {
		cfg.Tokens = []api.Token{{Name: "prometheus", Scope: api.ScopeRead, Token: readToken}}
		s, err := api.New(cfg, nc, ops.New(nc, st), api.WithGatherer(reg))
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(s.Handler())
		t.Cleanup(hs.Close)
		return bundle{url: hs.URL}
	}
	scraped := func(r response) bool {
		return r.status == http.StatusOK && strings.Contains(string(r.body), "warden_test_scrapes_total 1")
	}

	b := start(api.Config{})
	wantError(t, "/metrics without a token", b.call(t, "GET", "/metrics", "", nil), http.StatusUnauthorized, ops.CodeUnauthenticated)
	wantError(t, "/metrics with an unknown token", b.call(t, "GET", "/metrics", "not-a-known-token-at-all", nil), http.StatusUnauthorized, ops.CodeUnauthenticated)
	if r := b.call(t, "GET", "/metrics", readToken, nil); !scraped(r) {
		t.Errorf("/metrics with a read token: %d %s", r.status, r.body)
	}

	anon := start(api.Config{AnonymousScope: api.ScopeRead})
	wantError(t, "anonymous /metrics under a rebound name", anon.send(t, "GET", "/metrics", "evil.example", nil, nil), http.StatusForbidden, ops.CodeForbidden)
	if r := anon.send(t, "GET", "/metrics", "127.0.0.1:8080", nil, nil); !scraped(r) {
		t.Errorf("anonymous /metrics under an IP address: %d %s", r.status, r.body)
	}
	// The probes stay open: they read nothing.
	for _, p := range []string{"/healthz", "/readyz"} {
		if r := b.call(t, "GET", p, "", nil); r.status != http.StatusOK {
			t.Errorf("%s without a token: %d", p, r.status)
		}
	}
}

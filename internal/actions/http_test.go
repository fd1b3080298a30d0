package actions_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/wardenhq/warden/internal/actions"
)

// httpParams is the JSON of an http task for url.
func httpParams(t *testing.T, url string, extra map[string]any) json.RawMessage {
	t.Helper()
	p := map[string]any{"url": url}
	for k, v := range extra {
		p[k] = v
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A redirect must not take the request to a host allowed_hosts does not
// list: every hop is checked as the first.
func TestHTTPRedirects(t *testing.T) {
	t.Parallel()
	var otherHits atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		otherHits.Add(1)
		_, _ = w.Write([]byte("reached the other host"))
	}))
	t.Cleanup(other.Close)
	allowed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/away":
			http.Redirect(w, r, other.URL+"/", http.StatusFound)
		case "/home":
			http.Redirect(w, r, "/ok", http.StatusFound)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		default:
			_, _ = w.Write([]byte("ok"))
		}
	}))
	t.Cleanup(allowed.Close)
	cfg := actions.HTTPConfig{AllowedHosts: []string{mustHost(t, allowed.URL)}}
	var clientChecks atomic.Int32
	withClient := cfg
	withClient.Client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error {
		clientChecks.Add(1)
		return nil
	}}

	for _, c := range []struct {
		name string
		cfg  actions.HTTPConfig
	}{{"default client", cfg}, {"own client", withClient}} {
		do := actions.HTTP(c.cfg)
		t.Run(c.name+": to another host", func(t *testing.T) {
			out, err := do(context.Background(), httpParams(t, allowed.URL+"/away", nil))
			if !errors.Is(err, actions.ErrHostNotAllowed) || classOf(err) != "permanent" ||
				!strings.Contains(err.Error(), "redirect: host not allowed: \""+mustHost(t, other.URL)+"\" is not in http.allowed_hosts") {
				t.Fatalf("error %v (output %+v), want a permanent ErrHostNotAllowed naming the redirect's host", err, out)
			}
			if n := otherHits.Load(); n != 0 {
				t.Fatalf("the other host got %d requests, want none", n)
			}
		})
		t.Run(c.name+": within the host", func(t *testing.T) {
			out, err := do(context.Background(), httpParams(t, allowed.URL+"/home", nil))
			if o, ok := out.(actions.HTTPOutput); err != nil || !ok || o.BodyTail != "ok" {
				t.Fatalf("output %+v, error %v; want the redirect followed to /ok", out, err)
			}
		})
	}
	if n := clientChecks.Load(); n != 1 {
		t.Fatalf("the client's own CheckRedirect ran %d times, want once (for /home only)", n)
	}
	t.Run("loop", func(t *testing.T) {
		_, err := actions.HTTP(cfg)(context.Background(), httpParams(t, allowed.URL+"/loop", nil))
		if err == nil || !strings.Contains(err.Error(), "stopped after 10 redirects") {
			t.Fatalf("error %v, want it to stop after 10 redirects", err)
		}
	})
}

// Error texts reach logs and results, so they must not carry the secrets
// URLs often hold: a password, a token as user name, query values, a
// fragment.
func TestHTTPErrorsRedactURL(t *testing.T) {
	t.Parallel()
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-r.Context().Done()
			return
		}
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(failing.Close)
	host := mustHost(t, failing.URL)
	do := actions.HTTP(actions.HTTPConfig{})

	for _, c := range []struct {
		name  string
		url   string
		extra map[string]any
		want  []string // what the error must still say
	}{
		{name: "connection refused", url: "http://u:secret@127.0.0.1:1/?token=abc",
			want: []string{"GET http://u:xxxxx@127.0.0.1:1/?token=xxxxx: dial tcp 127.0.0.1:1"}},
		{name: "unexpected status", url: "http://u:secret@" + host + "/x?token=abc&abc&b=abc#abc",
			want: []string{"http://u:xxxxx@" + host + "/x?token=xxxxx&xxxxx&b=xxxxx: status 500"}},
		{name: "timeout", url: "http://u:secret@" + host + "/slow?token=abc", extra: map[string]any{"timeout": "50ms"},
			want: []string{"?token=xxxxx: http: request timed out after 50ms"}},
		{name: "token as user name", url: "http://abc@127.0.0.1:1/", want: []string{"http://xxxxx@127.0.0.1:1/"}},
		{name: "not http", url: "ftp://u:secret@example.com/?token=abc", want: []string{`got "ftp://u:xxxxx@example.com/?token=xxxxx"`}},
		{name: "does not parse", url: "http://u:secret@example.com:port/?token=abc", want: []string{`must be an absolute http(s) URL: invalid port ":port"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := do(context.Background(), httpParams(t, c.url, c.extra))
			if err == nil {
				t.Fatal("no error")
			}
			for _, secret := range []string{"secret", "abc"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q contains %q", err, secret)
				}
			}
			for _, want := range c.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q, want it to contain %q", err, want)
				}
			}
		})
	}
}

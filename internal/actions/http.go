package actions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/wardenhq/warden/pkg/protocol"
)

// HTTPConfig says where http may go.
type HTTPConfig struct {
	// AllowedHosts, when set, are the only hosts http talks to, matched
	// against the URL's host ("example.com" or "example.com:8443"), at
	// every redirect too. Defaults to none, which allows every host.
	AllowedHosts []string `yaml:"allowed_hosts"`
	// TailBytes is how many trailing bytes of the response body go into the
	// result. Defaults to 4096.
	TailBytes int `yaml:"tail_bytes"`
	// Client sends the requests. Defaults to a client without a global
	// timeout (the task's context bounds every request). http uses a copy
	// whose CheckRedirect checks AllowedHosts before calling the client's.
	Client *http.Client `yaml:"-"`
}

// HTTPParams are the parameters of http.
type HTTPParams struct {
	// Method defaults to GET.
	Method string `json:"method,omitempty"`
	// URL, http or https. Required.
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    string            `json:"body,omitempty"`
	// ExpectedStatus defaults to 200; any other status is an error.
	ExpectedStatus int `json:"expected_status,omitempty"`
	// Timeout bounds the request. Defaults to the task's deadline.
	Timeout protocol.Duration `json:"timeout,omitempty"`
}

// HTTPOutput is http's output; it is reported on failure too.
type HTTPOutput struct {
	Status    int    `json:"status"`
	BodyTail  string `json:"body_tail"`
	Truncated bool   `json:"truncated,omitempty"`
}

// ErrHostNotAllowed is wrapped when the URL's host, or a redirect's, is not
// in allowed_hosts.
var ErrHostNotAllowed = errors.New("host not allowed")

// maxRedirects is how many redirects http follows, as net/http's default,
// which a client's own CheckRedirect replaces.
const maxRedirects = 10

// HTTP returns the http action for cfg.
func HTTP(cfg HTTPConfig) Func {
	if cfg.TailBytes <= 0 {
		cfg.TailBytes = DefaultTailBytes
	}
	client := checkedClient(cfg.Client, cfg.AllowedHosts)
	return func(ctx context.Context, params json.RawMessage) (any, error) {
		var p HTTPParams
		if err := Decode(params, &p); err != nil {
			return nil, err
		}
		req, err := buildRequest(ctx, cfg, p)
		if err != nil {
			return nil, err
		}
		if p.Timeout > 0 {
			tctx, cancel := context.WithTimeoutCause(ctx, p.Timeout.Std(),
				fmt.Errorf("http: request timed out after %s", p.Timeout))
			defer cancel()
			req = req.WithContext(tctx)
		}
		shown := redactURL(req.URL)
		resp, err := client.Do(req)
		if err != nil {
			if cause := context.Cause(req.Context()); cause != nil {
				return nil, fmt.Errorf("http: %s %s: %w", req.Method, shown, cause)
			}
			// *url.Error repeats the URL with its query, and we show ours.
			var urlErr *url.Error
			if errors.As(err, &urlErr) {
				err = urlErr.Err
			}
			return nil, fmt.Errorf("http: %s %s: %w", req.Method, shown, err)
		}
		defer resp.Body.Close()
		body := newTail(cfg.TailBytes)
		_, copyErr := io.Copy(body, resp.Body)
		out := HTTPOutput{Status: resp.StatusCode, BodyTail: body.String(), Truncated: body.Truncated()}
		want := p.ExpectedStatus
		if want == 0 {
			want = http.StatusOK
		}
		if resp.StatusCode != want {
			return out, fmt.Errorf("http: %s %s: status %d, expected %d", req.Method, shown, resp.StatusCode, want)
		}
		if copyErr != nil {
			return out, fmt.Errorf("http: read body: %w", copyErr)
		}
		return out, nil
	}
}

func buildRequest(ctx context.Context, cfg HTTPConfig, p HTTPParams) (*http.Request, error) {
	if err := required("url", p.URL); err != nil {
		return nil, err
	}
	u, err := url.Parse(p.URL)
	if err != nil {
		// Not the URL itself, nor url.Error's text: it may hold a secret.
		var urlErr *url.Error
		if errors.As(err, &urlErr) {
			err = urlErr.Err
		}
		return nil, Permanentf("%w: field \"url\" must be an absolute http(s) URL: %w", ErrInvalidParams, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, Permanentf("%w: field \"url\" must be an absolute http(s) URL, got %q", ErrInvalidParams, redactURL(u))
	}
	if err := checkHost(cfg.AllowedHosts, u); err != nil {
		return nil, err
	}
	method := strings.ToUpper(p.Method)
	if method == "" {
		method = http.MethodGet
	}
	var body io.Reader
	if p.Body != "" {
		body = strings.NewReader(p.Body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, Permanentf("%w: %w", ErrInvalidParams, err)
	}
	for k, v := range p.Headers {
		req.Header.Set(k, v)
	}
	return req, nil
}

// checkHost returns a permanent error wrapping ErrHostNotAllowed when allowed
// is set and holds neither u's host nor its host name.
func checkHost(allowed []string, u *url.URL) error {
	if len(allowed) == 0 || slices.Contains(allowed, u.Host) || slices.Contains(allowed, u.Hostname()) {
		return nil
	}
	return Permanentf("%w: %q is not in http.allowed_hosts %q", ErrHostNotAllowed, u.Host, allowed)
}

// checkedClient is a copy of c (a new client when nil) that checks every
// redirect's host as the first request's: otherwise an allowed host, or
// anyone who controls its responses, could send the request anywhere.
func checkedClient(c *http.Client, allowed []string) *http.Client {
	var checked http.Client
	if c != nil {
		checked = *c
	}
	next := checked.CheckRedirect
	checked.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if err := checkHost(allowed, req.URL); err != nil {
			return fmt.Errorf("redirect: %w", err)
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= maxRedirects {
			return fmt.Errorf("stopped after %d redirects", maxRedirects)
		}
		return nil
	}
	return &checked
}

// redactURL is u as error texts show it, since they reach logs and results:
// the password, a user name standing alone (often a token, as in
// https://TOKEN@host) and every query value are replaced by "xxxxx", and
// the fragment is dropped. Query names are kept: they say what was sent.
func redactURL(u *url.URL) string {
	r := *u
	if r.User != nil {
		if _, hasPassword := r.User.Password(); !hasPassword {
			r.User = url.User("xxxxx")
		}
	}
	if r.RawQuery != "" {
		parts := strings.Split(r.RawQuery, "&")
		for i, part := range parts {
			if name, _, ok := strings.Cut(part, "="); ok {
				parts[i] = name + "=xxxxx"
			} else {
				parts[i] = "xxxxx" // a bare value, such as an API key
			}
		}
		r.RawQuery = strings.Join(parts, "&")
	}
	r.Fragment, r.RawFragment = "", ""
	return r.Redacted()
}

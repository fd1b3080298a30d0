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
	// against the URL's host ("example.com" or "example.com:8443").
	// Defaults to none, which allows every host.
	AllowedHosts []string `yaml:"allowed_hosts"`
	// TailBytes is how many trailing bytes of the response body go into the
	// result. Defaults to 4096.
	TailBytes int `yaml:"tail_bytes"`
	// Client sends the requests. Defaults to a client without a global
	// timeout (the task's context bounds every request).
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

// ErrHostNotAllowed is wrapped when the URL's host is not in allowed_hosts.
var ErrHostNotAllowed = errors.New("host not allowed")

// HTTP returns the http action for cfg.
func HTTP(cfg HTTPConfig) Func {
	if cfg.TailBytes <= 0 {
		cfg.TailBytes = DefaultTailBytes
	}
	client := cfg.Client
	if client == nil {
		client = &http.Client{}
	}
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
		resp, err := client.Do(req)
		if err != nil {
			if cause := context.Cause(req.Context()); cause != nil {
				return nil, fmt.Errorf("http: %s %s: %w", req.Method, p.URL, cause)
			}
			return nil, fmt.Errorf("http: %s %s: %w", req.Method, p.URL, err)
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
			return out, fmt.Errorf("http: %s %s: status %d, expected %d", req.Method, p.URL, resp.StatusCode, want)
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
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, Permanentf("%w: field \"url\" must be an absolute http(s) URL, got %q", ErrInvalidParams, p.URL)
	}
	if len(cfg.AllowedHosts) > 0 && !slices.Contains(cfg.AllowedHosts, u.Host) && !slices.Contains(cfg.AllowedHosts, u.Hostname()) {
		return nil, Permanentf("%w: %q is not in http.allowed_hosts %q", ErrHostNotAllowed, u.Host, cfg.AllowedHosts)
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

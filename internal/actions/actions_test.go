package actions_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/actions"
)

// classOf reads the class the way pkg/agent does.
func classOf(err error) string {
	var c interface{ ErrorClass() string }
	if errors.As(err, &c) {
		return c.ErrorClass()
	}
	return ""
}

func TestActions(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusInternalServerError)
		}
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write([]byte(r.Method + " " + r.Header.Get("X-Test") + " " + string(b) + strings.Repeat("x", 10)))
	}))
	t.Cleanup(srv.Close)
	host := mustHost(t, srv.URL)

	cfg := actions.Config{
		Shell: actions.ShellConfig{AllowedCommands: []string{"echo", "sh", "sleep"}, TailBytes: 8},
		HTTP:  actions.HTTPConfig{AllowedHosts: []string{host}, TailBytes: 64},
	}
	builtins := actions.Builtins(cfg)

	tests := []struct {
		name    string
		action  string
		params  string
		timeout time.Duration
		want    string // substring of the JSON output
		wantErr string // substring of the error; "" = success
		class   string
	}{
		{name: "echo returns params", action: "echo", params: `{"a":1}`, want: `{"a":1}`},
		{name: "echo empty", action: "echo", params: ``, want: `{}`},
		{name: "sleep", action: "sleep", params: `{"duration":"10ms"}`, want: `"slept":"10ms"`},
		{name: "sleep honours ctx", action: "sleep", params: `{"duration":"1m"}`, timeout: 50 * time.Millisecond, wantErr: "deadline exceeded"},
		{name: "sleep unknown field", action: "sleep", params: `{"duraton":"1s"}`, wantErr: `unknown field "duraton"`, class: "permanent"},
		{name: "sleep missing duration", action: "sleep", params: `{}`, wantErr: `"duration" is required`, class: "permanent"},
		{name: "sleep wrong type", action: "sleep", params: `{"duration":true}`, wantErr: "invalid params", class: "permanent"},
		{name: "shell ok with tail", action: "shell", params: `{"command":"echo","args":["hello","world"]}`, want: `"stdout_tail":"o world\n"`},
		{name: "shell no shell expansion", action: "shell", params: `{"command":"echo","args":["$HOME"]}`, want: `"stdout_tail":"$HOME\n"`},
		{name: "shell env", action: "shell", params: `{"command":"sh","args":["-c","echo $FOO"],"env":{"FOO":"bar"}}`, want: `"stdout_tail":"bar\n"`},
		{name: "shell exit code", action: "shell", params: `{"command":"sh","args":["-c","echo oops >&2; exit 3"]}`, want: `"exit_code":3`, wantErr: "exited with code 3"},
		{name: "shell not allowed", action: "shell", params: `{"command":"rm","args":["-rf","/"]}`, wantErr: "not in shell.allowed_commands", class: "permanent"},
		{name: "shell not allowed by path", action: "shell", params: `{"command":"/bin/echo"}`, wantErr: "not allowed", class: "permanent"},
		{name: "shell timeout param", action: "shell", params: `{"command":"sleep","args":["5"],"timeout":"50ms"}`, wantErr: "timed out after 50ms"},
		{name: "shell unknown field", action: "shell", params: `{"command":"echo","argv":[]}`, wantErr: `unknown field "argv"`, class: "permanent"},
		{name: "shell missing command", action: "shell", params: `{}`, wantErr: `"command" is required`, class: "permanent"},
		{name: "http get", action: "http", params: `{"url":"` + srv.URL + `/ok","headers":{"X-Test":"h"}}`, want: `"status":200`},
		{name: "http post body", action: "http", params: `{"method":"post","url":"` + srv.URL + `/ok","body":"payload"}`, want: `POST  payload`},
		{name: "http unexpected status", action: "http", params: `{"url":"` + srv.URL + `/fail"}`, want: `"status":500`, wantErr: "status 500, expected 200"},
		{name: "http expected status", action: "http", params: `{"url":"` + srv.URL + `/fail","expected_status":500}`, want: `"status":500`},
		{name: "http host not allowed", action: "http", params: `{"url":"http://example.invalid/"}`, wantErr: "not in http.allowed_hosts", class: "permanent"},
		{name: "http bad url", action: "http", params: `{"url":"ftp://x"}`, wantErr: `"url" must be`, class: "permanent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			out, err := builtins[tt.action](ctx, json.RawMessage(tt.params))
			if tt.wantErr == "" && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error %v, want it to contain %q", err, tt.wantErr)
			}
			if got := classOf(err); got != tt.class {
				t.Fatalf("class %q, want %q (err %v)", got, tt.class, err)
			}
			if tt.want != "" {
				b, _ := json.Marshal(out)
				if !strings.Contains(string(b), tt.want) {
					t.Fatalf("output %s, want it to contain %s", b, tt.want)
				}
			}
		})
	}
}

func TestDecodeTrailingData(t *testing.T) {
	t.Parallel()
	var v struct{ A int }
	err := actions.Decode(json.RawMessage(`{"A":1} {"A":2}`), &v)
	if !errors.Is(err, actions.ErrInvalidParams) || classOf(err) != "permanent" {
		t.Fatalf("want permanent ErrInvalidParams, got %v", err)
	}
}

func mustHost(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

package actions_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/wardenhq/warden/internal/actions"
	"github.com/wardenhq/warden/internal/config"
)

func TestShellExitCodes(t *testing.T) {
	t.Parallel()
	cfg := actions.ShellConfig{
		AllowedCommands: []string{"sh"},
		ExitCodes:       map[int]string{75: "retriable", 1: "permanent", 3: " Permanent "},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	shell := actions.Shell(cfg)
	cfg.ExitCodes[2] = "retriable" // the action keeps its own copy
	cases := []struct {
		name      string
		params    string
		code      int
		class     string
		wantErr   string
		permanent bool // a parameter error rather than an exit
	}{
		{name: "success", params: `{"command":"sh","args":["-c","exit 0"]}`},
		{name: "mapped retriable", params: `{"command":"sh","args":["-c","exit 75"]}`, code: 75, class: "retriable"},
		{name: "mapped permanent", params: `{"command":"sh","args":["-c","exit 1"]}`, code: 1, class: "permanent"},
		{name: "mapping is normalised", params: `{"command":"sh","args":["-c","exit 3"]}`, code: 3, class: "permanent"},
		{name: "unmapped", params: `{"command":"sh","args":["-c","exit 2"]}`, code: 2, class: ""},
		{name: "task mapping overrides", params: `{"command":"sh","args":["-c","exit 1"],"exit_codes":{"1":"retriable"}}`, code: 1, class: "retriable"},
		{name: "task mapping adds", params: `{"command":"sh","args":["-c","exit 4"],"exit_codes":{"4":"permanent"}}`, code: 4, class: "permanent"},
		{name: "task mapping bad class", params: `{"command":"sh","args":["-c","exit 4"],"exit_codes":{"4":"maybe"}}`,
			wantErr: `field "exit_codes": exit code 4: class must be`, class: "permanent", permanent: true},
		{name: "task mapping bad code", params: `{"command":"sh","exit_codes":{"0":"retriable"}}`,
			wantErr: "exit code 0: must be between 1 and 255", class: "permanent", permanent: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			out, err := shell(context.Background(), json.RawMessage(c.params))
			if c.permanent {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) || !errors.Is(err, actions.ErrInvalidParams) || classOf(err) != "permanent" {
					t.Fatalf("error %v, want a permanent invalid-params error containing %q", err, c.wantErr)
				}
				return
			}
			if c.code == 0 {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			var exit *actions.ExitError
			if !errors.As(err, &exit) || exit.Code != c.code {
				t.Fatalf("error %v, want an *ExitError with code %d", err, c.code)
			}
			if got := classOf(err); got != c.class {
				t.Fatalf("class %q, want %q", got, c.class)
			}
			if want := "exited with code"; !strings.Contains(err.Error(), want) {
				t.Fatalf("message %q, want it to contain %q", err, want)
			}
			if o, ok := out.(actions.ShellOutput); !ok || o.ExitCode != c.code {
				t.Fatalf("output %#v, want exit_code %d", out, c.code)
			}
		})
	}
}

func TestShellConfigExitCodes(t *testing.T) {
	t.Parallel()
	var cfg actions.ShellConfig
	if err := config.Decode([]byte("allowed_commands: [make]\nexit_codes: {75: retriable, 1: permanent}\n"), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.ExitCodes[75] != "retriable" || cfg.ExitCodes[1] != "permanent" {
		t.Fatalf("decoded %+v", cfg)
	}
	for _, bad := range []struct {
		codes map[int]string
		want  string
	}{
		{map[int]string{0: "retriable"}, "shell.exit_codes: exit code 0: must be between 1 and 255"},
		{map[int]string{256: "retriable"}, "exit code 256"},
		{map[int]string{2: "retriable", 1: "soon"}, `exit code 1: class must be "retriable" or "permanent", got "soon"`},
	} {
		err := actions.ShellConfig{ExitCodes: bad.codes}.Validate()
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Validate(%v) = %v, want %q", bad.codes, err, bad.want)
		}
	}
}

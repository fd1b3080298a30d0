package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// decodeJSON decodes the whole of s into v: one JSON document, nothing
// else (a human line before or after it fails).
func decodeJSON(t *testing.T, what, s string, v any) bool {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	if err := dec.Decode(v); err != nil {
		t.Errorf("%s: stdout is not one JSON document (%v):\n%s", what, err, s)
		return false
	}
	if dec.More() {
		t.Errorf("%s: more than one JSON document on stdout:\n%s", what, s)
		return false
	}
	return true
}

// jsonError is what a failing command prints on stderr with --json.
type jsonError struct {
	Error    string `json:"error"`
	Code     string `json:"code"`
	ExitCode int    `json:"exit_code"`
}

// With --json, setup prints one JSON document on stdout: it printed its
// human line whatever the flag said. Its failures stay JSON on stderr.
func TestSetupPrintsJSON(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := warden(t, "", "--json", "setup", "--task-shards", "1", "--server", e.url)
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("setup --json: exit %d, stderr %q", r.code, r.stderr)
	}
	var s struct {
		Status     string `json:"status"`
		Replicas   int    `json:"replicas"`
		TaskShards int    `json:"task_shards"`
	}
	if decodeJSON(t, "setup --json", r.stdout, &s) && (s.Status != "up_to_date" || s.TaskShards != 1 || s.Replicas != 1) {
		t.Errorf("setup --json: %+v", s)
	}

	r = warden(t, "", "--json", "setup", "--server", "nats://127.0.0.1:1")
	var fail jsonError
	if err := json.Unmarshal([]byte(r.stderr), &fail); err != nil || r.code != exitUnavailable || fail.ExitCode != exitUnavailable || fail.Code != "unavailable" || r.stdout != "" {
		t.Errorf("setup --json, no server: exit %d, stdout %q, stderr %q (%v)", r.code, r.stdout, r.stderr, err)
	}
}

// With --json, every creds subcommand prints one JSON document on stdout
// and nothing on stderr: they printed their human lines, and their notes
// (reload the servers) on stderr, whatever the flag said.
func TestCredsPrintJSON(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := warden(t, "", "--json", "creds", "init", "--dir", dir, "--agents", "default.a1")
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("creds init --json: exit %d, stderr %q", r.code, r.stderr)
	}
	var in struct {
		Operator     string            `json:"operator"`
		Account      string            `json:"account"`
		Users        map[string]string `json:"users"`
		ServerConfig string            `json:"server_config"`
	}
	if decodeJSON(t, "creds init --json", r.stdout, &in) &&
		(in.Operator == "" || in.Account == "" || in.Users["agent.default.a1"] == "" || in.Users["admin"] == "" || in.ServerConfig == "") {
		t.Errorf("creds init --json: %+v", in)
	}

	for _, c := range []struct {
		args     []string
		identity string
		path     bool // a credential file written
		revoked  bool // an old credential revoked: reload the servers
	}{
		{[]string{"creds", "agent", "--pool", "default", "--id", "a2"}, "agent.default.a2", true, false},
		{[]string{"creds", "agent", "--pool", "default", "--id", "a2", "--rotate"}, "agent.default.a2", true, true},
		{[]string{"creds", "rotate", "scheduler"}, "scheduler", true, true},
		{[]string{"creds", "revoke", "agent.default.a2"}, "agent.default.a2", false, true},
	} {
		r := warden(t, "", append([]string{"--json", "--dir", dir}, c.args...)...)
		if r.code != exitOK || r.stderr != "" {
			t.Errorf("%v --json: exit %d, stderr %q", c.args, r.code, r.stderr)
		}
		var res struct {
			Identity string `json:"identity"`
			Path     string `json:"path"`
			Revoked  bool   `json:"revoked"`
			Note     string `json:"note"`
		}
		if !decodeJSON(t, strings.Join(c.args, " ")+" --json", r.stdout, &res) {
			continue
		}
		if res.Identity != c.identity || (res.Path != "") != c.path || res.Revoked != c.revoked || (c.revoked && res.Note == "") {
			t.Errorf("%v --json: %+v", c.args, res)
			continue
		}
		if c.path {
			if _, err := os.Stat(res.Path); err != nil {
				t.Errorf("%v --json: %v", c.args, err)
			}
		}
	}

	r = warden(t, "", "--json", "creds", "roles", "--task-shards", "1")
	var roles []map[string]any
	if decodeJSON(t, "creds roles --json", r.stdout, &roles) && len(roles) == 0 {
		t.Errorf("creds roles --json: no roles")
	}
	r = warden(t, "", "--json", "creds", "init", "--dir", t.TempDir(), "--agents", "not a token")
	var fail jsonError
	if err := json.Unmarshal([]byte(r.stderr), &fail); err != nil || r.code != exitUsage || fail.ExitCode != exitUsage || fail.Code != "invalid_argument" || r.stdout != "" {
		t.Errorf("creds init --json, bad agent: exit %d, stdout %q, stderr %q (%v)", r.code, r.stdout, r.stderr, err)
	}
}

package main

import (
	"os"
	"strings"
	"testing"

	"github.com/wardenhq/warden/internal/creds"
)

// TestCredsInitAgainKeepsTLSAndRoutes: running `creds init` again on a
// directory (to add an agent, to change the sync interval) rewrote
// server.conf from its flags alone, so a directory made with --tls and
// --routes silently lost both: clients and routes in plain text, a
// cluster of one. Flags not given keep the directory's settings; given,
// they change them.
func TestCredsInitAgainKeepsTLSAndRoutes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	init := func(args ...string) {
		t.Helper()
		r := warden(t, "", append([]string{"creds", "init", "--dir", dir}, args...)...)
		if r.code != exitOK {
			t.Fatalf("creds init %v: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	conf := func() string {
		t.Helper()
		b, err := os.ReadFile(creds.ServerConfPath(dir))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	init("--tls", "--routes", "nats-1:6222,nats-2:6222")
	first := conf()
	if !strings.Contains(first, "verify: true") || !strings.Contains(first, "nats-2:6222") {
		t.Fatalf("server.conf with --tls --routes lacks TLS or routes:\n%s", first)
	}
	init("--agents", "default.a1")
	if again := conf(); again != first {
		t.Fatalf("creds init --agents changed server.conf:\n%s\nwas:\n%s", again, first)
	}
	m, err := creds.LoadManifest(dir)
	if err != nil || !m.TLS || len(m.Routes) != 2 || m.Users["agent.default.a1"] == "" {
		t.Fatalf("manifest after adding an agent: %+v, %v", m, err)
	}
	// Given, they change it.
	init("--tls=false", "--routes", "")
	if c := conf(); strings.Contains(c, "verify: true") || strings.Contains(c, "nats-2:6222") {
		t.Fatalf("--tls=false --routes '' kept TLS or routes:\n%s", c)
	}
}

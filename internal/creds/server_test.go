package creds_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/creds"
	"github.com/wardenhq/warden/streams"
)

// serverOptions parses dir's server.conf as nats-server does.
func serverOptions(t *testing.T, dir string) *server.Options {
	t.Helper()
	opts, err := server.ProcessConfigFile(creds.ServerConfPath(dir))
	if err != nil {
		t.Fatalf("server.conf: %v", err)
	}
	return opts
}

// docs/reliability.md asks for sync_interval: always, in a server.conf
// that says "do not edit: regenerate" and that every `creds init`
// rewrote. It is a setting of Generate now, kept in the manifest so that a
// later run (one adding an agent) keeps it.
func TestSyncIntervalIsSetAndKept(t *testing.T) {
	t.Setenv("NATS_SERVER_NAME", "sync-test")
	dir := t.TempDir()
	gen := func(sync string, agents ...string) error {
		_, err := creds.Generate(creds.Config{Dir: dir, Agents: agents, SyncInterval: sync,
			Listen: "127.0.0.1:-1", StoreDir: filepath.Join(dir, "jetstream")})
		return err
	}
	if err := gen(""); err != nil {
		t.Fatal(err)
	}
	if o := serverOptions(t, dir); o.SyncAlways || o.SyncInterval != 0 {
		t.Fatalf("no setting: sync always %v, interval %s; want nats-server's default", o.SyncAlways, o.SyncInterval)
	}
	if err := gen(creds.SyncAlways); err != nil {
		t.Fatal(err)
	}
	if err := gen("", "default.a1"); err != nil { // a later run that only adds an agent
		t.Fatal(err)
	}
	opts := serverOptions(t, dir)
	if !opts.SyncAlways {
		t.Fatal("sync_interval always was lost by a later creds init")
	}
	// The server runs with it.
	opts.HTTPHost, opts.HTTPPort, opts.NoSigs = "", 0, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL(), nats.UserCredentials(creds.CredsPath(dir, creds.RoleSetup)))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()

	if err := gen("30s"); err != nil {
		t.Fatal(err)
	}
	if o := serverOptions(t, dir); o.SyncAlways || o.SyncInterval != 30*time.Second {
		t.Fatalf("30s: sync always %v, interval %s", o.SyncAlways, o.SyncInterval)
	}
	if err := gen(creds.SyncDefault); err != nil {
		t.Fatal(err)
	}
	if o := serverOptions(t, dir); o.SyncAlways || o.SyncInterval != 0 {
		t.Fatalf("default: sync always %v, interval %s", o.SyncAlways, o.SyncInterval)
	}
	for _, bad := range []string{"sometimes", "-1s", "0s"} {
		if err := gen(bad); err == nil {
			t.Errorf("sync interval %q accepted", bad)
		}
	}
}

// task_shards is bounded (streams.MaxTaskShards) because every role
// credential lists each shard's subjects: at the bound, each one still
// fits in the generated server's max_control_line and connects.
func TestEveryCredentialConnectsAtMaxTaskShards(t *testing.T) {
	t.Setenv("NATS_SERVER_NAME", "shards-test")
	dir := t.TempDir()
	m, err := creds.Generate(creds.Config{Dir: dir, TaskShards: streams.MaxTaskShards, Agents: []string{"default.a1"},
		Listen: "127.0.0.1:-1", StoreDir: filepath.Join(dir, "jetstream")})
	if err != nil {
		t.Fatal(err)
	}
	opts := serverOptions(t, dir)
	opts.HTTPHost, opts.HTTPPort, opts.NoSigs = "", 0, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	for _, id := range m.Identities() {
		path := creds.CredsPath(dir, id)
		if id == creds.AgentIdentity("default", "a1") {
			path = creds.AgentCredsPath(dir, "default", "a1")
		}
		nc, err := nats.Connect(srv.ClientURL(), nats.UserCredentials(path))
		if err != nil {
			t.Errorf("%s at task_shards %d: %v", id, streams.MaxTaskShards, err)
			continue
		}
		nc.Close()
	}
	if _, err := creds.Generate(creds.Config{Dir: t.TempDir(), TaskShards: streams.MaxTaskShards + 1}); err == nil {
		t.Fatalf("task_shards %d accepted", streams.MaxTaskShards+1)
	}
}

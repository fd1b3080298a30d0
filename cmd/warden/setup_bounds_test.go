package main

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/creds"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
)

// warden setup --partitions 5000 was applied and written into the
// deployment record, after which no scheduler (partitions 1..1024) could
// start. Settings out of their bounds are a usage error, and nothing is
// written.
func TestSetupRefusesSettingsOutOfBounds(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	for _, c := range []struct {
		flag, value, key string
	}{
		{"--partitions", "5000", "partitions"},
		{"--partitions", "-3", "partitions"},
		{"--task-shards", "1000", "task_shards"},
		{"--replicas", "9", "replicas"},
	} {
		r := warden(t, "", "setup", c.flag, c.value, "--server", srv.URL)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.key) {
			t.Errorf("setup %s %s: exit %d, stderr %q; want exit %d naming %s", c.flag, c.value, r.code, r.stderr, exitUsage, c.key)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if kv, err := js.KeyValue(ctx, protocol.BucketDeployment); err == nil {
		if e, err := kv.Get(ctx, protocol.KeyDeployment); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("a refused setup wrote the deployment record: %s, %v", e.Value(), err)
		}
	}
}

// creds init --sync-interval always writes it into server.conf, and a
// later creds init (one adding an agent) keeps it: docs/reliability.md
// asked for it in a file that says "do not edit: regenerate".
func TestCredsInitSyncInterval(t *testing.T) {
	t.Setenv("NATS_SERVER_NAME", "cli-test")
	dir := t.TempDir()
	store := filepath.Join(dir, "jetstream")
	if r := warden(t, "", "creds", "init", "--dir", dir, "--store-dir", store, "--sync-interval", "always"); r.code != exitOK {
		t.Fatalf("creds init --sync-interval always: exit %d, %s", r.code, r.stderr)
	}
	if r := warden(t, "", "creds", "init", "--dir", dir, "--store-dir", store, "--agents", "default.a1"); r.code != exitOK {
		t.Fatalf("creds init --agents: exit %d, %s", r.code, r.stderr)
	}
	opts, err := server.ProcessConfigFile(creds.ServerConfPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	if !opts.SyncAlways {
		t.Fatal("server.conf does not sync every write")
	}
	r := warden(t, "", "creds", "init", "--dir", t.TempDir(), "--sync-interval", "sometimes")
	if r.code != exitUsage || !strings.Contains(r.stderr, "sometimes") {
		t.Fatalf("--sync-interval sometimes: exit %d, %q", r.code, r.stderr)
	}
	r = warden(t, "", "creds", "init", "--dir", t.TempDir(), "--task-shards", "1000")
	if r.code != exitUsage || !strings.Contains(r.stderr, "task_shards") {
		t.Fatalf("--task-shards 1000: exit %d, %q", r.code, r.stderr)
	}
}

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// keepLogs copies every process's output (killed ones included) and the
// ledger into the directory named by WARDEN_CHAOS_LOGS, when it is set,
// once the test ends: a diagnostic for stories that span the whole run
// (a slow first dispatch), not only the stuck or last job's.
func keepLogs(t *testing.T, c *cluster) {
	dir := os.Getenv("WARDEN_CHAOS_LOGS")
	if dir == "" {
		return
	}
	t.Cleanup(func() {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Logf("keep logs: %v", err)
			return
		}
		for name, r := range c.roles {
			for i, p := range r.history {
				_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s#%d.log", name, i)), []byte(p.Output()), 0o644)
			}
		}
		if c.nats != nil {
			_ = os.WriteFile(filepath.Join(dir, "nats-server.log"), []byte(c.nats.Output()), 0o644)
		}
		_ = os.WriteFile(filepath.Join(dir, "faults"), []byte(strings.Join(c.faults, "\n")+"\n"), 0o644)
		if b, err := os.ReadFile(c.ledger); err == nil {
			_ = os.WriteFile(filepath.Join(dir, "ledger"), b, 0o644)
		}
		t.Logf("process logs and ledger kept in %s", dir)
	})
}

// keepRecords writes every update of the job store the run makes (the
// time it was seen, key, revision, value) to records.jsonl in the
// WARDEN_CHAOS_LOGS directory, when it is set: each job's timeline, with
// the reasons a step gave for waiting (its "waiting" field).
func keepRecords(ctx context.Context, t *testing.T, js jetstream.JetStream) {
	dir := os.Getenv("WARDEN_CHAOS_LOGS")
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("keep records: %v", err)
		return
	}
	f, err := os.Create(filepath.Join(dir, "records.jsonl"))
	if err != nil {
		t.Logf("keep records: %v", err)
		return
	}
	kv, _ := waitKV(ctx, t, js, protocol.BucketJobs)
	watcher, err := kv.WatchAll(ctx)
	if err != nil {
		t.Logf("keep records: %v", err)
		_ = f.Close()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { _ = watcher.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-watcher.Updates():
				if !ok {
					return
				}
				if e == nil {
					continue
				}
				line, _ := json.Marshal(map[string]any{"seen": time.Now().UTC(), "key": e.Key(), "rev": e.Revision(),
					"op": e.Operation().String(), "value": json.RawMessage(orNull(e.Value()))})
				_, _ = f.Write(append(line, '\n'))
			}
		}
	}()
	t.Cleanup(func() {
		<-done
		_ = f.Close()
	})
}

func orNull(b []byte) []byte {
	if !json.Valid(b) || len(b) == 0 {
		return []byte("null")
	}
	return b
}

// logLevelArgs adds --log-level from the environment variable env, when
// it is set (WARDEN_CHAOS_SCHEDULER_LOG_LEVEL=debug logs every dispatch).
func logLevelArgs(env string, args ...string) []string {
	if l := os.Getenv(env); l != "" {
		args = append(args, "--log-level", l)
	}
	return args
}

// note records a fault with the time (UTC) it was made.
func (c *cluster) note(format string, args ...any) {
	c.faults = append(c.faults, time.Now().UTC().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}

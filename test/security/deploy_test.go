// Package security runs Warden against a NATS server in the production
// auth configuration that `warden creds` generates (the same files
// docker-compose uses): operator/JWT mode, one identity per role and per
// agent. It checks that every role can do its work and nothing else.
package security

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/creds"
	"github.com/wardenhq/warden/internal/natsconn"
	"github.com/wardenhq/warden/streams"
)

// shards is the task shard count of the test deployment.
const shards = 4

func TestMain(m *testing.M) {
	// server.conf takes the node's name from the environment.
	_ = os.Setenv("NATS_SERVER_NAME", "security-test")
	os.Exit(m.Run())
}

// violationLog keeps the server's permission violation log lines.
type violationLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *violationLog) record(format string, v ...any) {
	s := fmt.Sprintf(format, v...)
	if strings.Contains(s, "Violation") {
		l.mu.Lock()
		l.lines = append(l.lines, s)
		l.mu.Unlock()
	}
}

func (l *violationLog) Noticef(string, ...any)    {}
func (l *violationLog) Warnf(f string, v ...any)  { l.record(f, v...) }
func (l *violationLog) Fatalf(f string, v ...any) { l.record(f, v...) }
func (l *violationLog) Errorf(f string, v ...any) { l.record(f, v...) }
func (l *violationLog) Debugf(string, ...any)     {}
func (l *violationLog) Tracef(string, ...any)     {}
func (l *violationLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}
func (l *violationLog) reset()         { l.mu.Lock(); l.lines = nil; l.mu.Unlock() }
func (l *violationLog) count() int     { l.mu.Lock(); defer l.mu.Unlock(); return len(l.lines) }
func (l *violationLog) String() string { return strings.Join(l.snapshot(), "\n") }
func (l *violationLog) none(t *testing.T, what string) {
	t.Helper()
	if n := l.count(); n > 0 {
		t.Fatalf("%s: %d permission violations:\n%s", what, n, l)
	}
}

// deployment is a running server in the production auth configuration.
type deployment struct {
	dir  string
	url  string
	srv  *server.Server
	log  *violationLog
	mani *creds.Manifest
}

// start generates a credentials directory (with credentials for agents,
// "<pool>.<id>") and starts a server from its server.conf.
func start(t *testing.T, agents ...string) *deployment {
	t.Helper()
	dir := t.TempDir()
	m, err := creds.Generate(creds.Config{
		Dir: dir, TaskShards: shards, Agents: agents,
		Listen: "127.0.0.1:-1", StoreDir: filepath.Join(dir, "jetstream"),
	})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(creds.ServerConfPath(dir))
	if err != nil {
		t.Fatalf("server.conf: %v", err)
	}
	opts.HTTPHost, opts.HTTPPort = "", 0 // no monitoring port in tests
	opts.NoSigs = true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	vl := &violationLog{}
	srv.SetLoggerV2(vl, false, false, false)
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return &deployment{dir: dir, url: srv.ClientURL(), srv: srv, log: vl, mani: m}
}

func (d *deployment) credsOf(identity string) string {
	if pool, id, ok := strings.Cut(strings.TrimPrefix(identity, "agent."), "."); ok && strings.HasPrefix(identity, "agent.") {
		return creds.AgentCredsPath(d.dir, pool, id)
	}
	return creds.CredsPath(d.dir, identity)
}

// conn is one identity's connection.
type conn struct {
	identity string
	nc       *nats.Conn
	js       jetstream.JetStream
	mu       sync.Mutex
	refused  []*natsconn.PermissionError
}

func (d *deployment) connect(t *testing.T, identity string) *conn {
	t.Helper()
	nc, js, err := natsconn.Connect(natsconn.Options{URL: d.url, Creds: d.credsOf(identity), Name: "test " + identity}, zerolog.Nop())
	if err != nil {
		t.Fatalf("connect as %s: %v", identity, err)
	}
	t.Cleanup(nc.Close)
	c := &conn{identity: identity, nc: nc, js: js}
	natsconn.OnPermissionError(nc, func(pe *natsconn.PermissionError) {
		c.mu.Lock()
		c.refused = append(c.refused, pe)
		c.mu.Unlock()
	})
	return c
}

// refusedSubject waits until the server refused op on subject for this
// connection and checks that the error names the identity.
func (c *conn) expectRefused(t *testing.T, op, subject string) {
	t.Helper()
	waitFor(t, 5*time.Second, fmt.Sprintf("%s refused to %s %q", c.identity, op, subject), func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, pe := range c.refused {
			if pe.Op == op && pe.Subject == subject {
				if pe.Identity != c.identity {
					t.Fatalf("permission error names %q, want %q", pe.Identity, c.identity)
				}
				if !errors.Is(pe, nats.ErrPermissionViolation) {
					t.Fatalf("permission error does not match nats.ErrPermissionViolation")
				}
				return true
			}
		}
		return false
	})
}

func (c *conn) refusals() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, pe := range c.refused {
		out = append(out, pe.Op+" "+pe.Subject)
	}
	return out
}

// setupStreams creates every stream and bucket as the setup identity.
func (d *deployment) setupStreams(t *testing.T) {
	t.Helper()
	c := d.connect(t, creds.RoleSetup)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, c.js, streams.Options{TaskShards: shards}); err != nil {
		t.Fatalf("setup: %v", err)
	}
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// shortCtx bounds one operation that the server is expected to refuse
// (a refused request is dropped, so the caller's timeout ends it).
func shortCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 500*time.Millisecond)
}

func asSetup(err error, target **streams.SetupError) bool      { return errors.As(err, target) }
func asPerm(err error, target **natsconn.PermissionError) bool { return errors.As(err, target) }

package natstest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/embedded"
	"github.com/wardenhq/warden/streams"
)

// Server is a running test server. Down and Up restart it on the same
// port with the same store, as a nats-server restart.
type Server struct {
	*server.Server
	URL        string
	Dir        string
	port       int
	maxPayload int32
}

// New starts a server with JetStream on a random port in t.TempDir().
func New(t testing.TB) *Server { return newServer(t, 0) }

// NewLimited is New with a server that takes messages of at most
// maxPayload bytes (the default is 1 MiB).
func NewLimited(t testing.TB, maxPayload int32) *Server { return newServer(t, maxPayload) }

func newServer(t testing.TB, maxPayload int32) *Server {
	t.Helper()
	s := &Server{Dir: t.TempDir(), port: -1, maxPayload: maxPayload}
	s.Up(t)
	s.port = s.Addr().(*net.TCPAddr).Port
	s.URL = s.ClientURL()
	t.Cleanup(s.Down)
	return s
}

// Down shuts the server down and keeps its store, as a nats-server that
// stopped; Up starts it again. Down on a stopped server does nothing.
func (s *Server) Down() {
	if s.Server != nil {
		s.Shutdown()
		s.WaitForShutdown()
		s.Server = nil
	}
}

// Up starts the server (again) on its port with its store: clients that
// reconnect forever come back, and JetStream keeps what it stored.
func (s *Server) Up(t testing.TB) {
	t.Helper()
	srv, err := embedded.Start(embedded.Options{Port: s.port, StoreDir: s.Dir, ServerName: "test", MaxPayload: s.maxPayload})
	if err != nil {
		t.Fatalf("start nats: %v", err)
	}
	s.Server = srv
}

// Start is the setup most tests need: a server (New), a connection and
// JetStream context (Connect), and Warden's streams and buckets applied with
// opts (Ensure). Everything is torn down when the test ends.
func Start(t testing.TB, opts streams.Options) (*Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	s := New(t)
	nc, js := s.Connect(t)
	s.Ensure(t, js, opts)
	return s, nc, js
}

// Connect returns a connection and JetStream context closed at test end.
func (s *Server) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return s.connect(t)
}

// ConnectReconnecting returns a connection that reconnects forever, wait
// apart and without jitter, as Warden's processes connect (natsconn): the
// one to use across Down and Up. Closed at test end.
func (s *Server) ConnectReconnecting(t testing.TB, wait time.Duration) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return s.connect(t, nats.MaxReconnects(-1), nats.ReconnectWait(wait), nats.ReconnectJitter(0, 0))
}

func (s *Server) connect(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.URL, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// Ensure applies Warden's streams and buckets with the given options.
func (s *Server) Ensure(t testing.TB, js jetstream.JetStream, opts streams.Options) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, js, opts); err != nil {
		t.Fatalf("ensure streams: %v", err)
	}
}

// Eventually polls cond every 10ms until it returns true or the timeout
// passes, then fails the test with msg.
func Eventually(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s: %s", timeout, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// PublishAll publishes msgs pipelined and waits for every PubAck, failing
// the test on the first error or a PubAck missing after 30 s: a test's own
// round trips then do not spread its submissions out.
func PublishAll(t testing.TB, js jetstream.JetStream, msgs ...*nats.Msg) {
	t.Helper()
	// In windows well below the client's limit of outstanding async
	// publishes (4,000 by default): past it a publish waits 200 ms for
	// room and then fails, which a server slowed by a busy machine
	// (make test on 2 cores) did not always give.
	const window = 1024
	timeout := time.After(30 * time.Second)
	for len(msgs) > 0 {
		n := min(len(msgs), window)
		acks := make([]jetstream.PubAckFuture, 0, n)
		for _, m := range msgs[:n] {
			f, err := js.PublishMsgAsync(m)
			if err != nil {
				t.Fatalf("publish %s: %v", m.Subject, err)
			}
			acks = append(acks, f)
		}
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatalf("publish %s: %v", f.Msg().Subject, err)
			case <-timeout:
				t.Fatalf("no PubAck for %s in 30s", f.Msg().Subject)
			}
		}
		msgs = msgs[n:]
	}
}

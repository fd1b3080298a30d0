// Package natstest starts an embedded JetStream server for tests: random port,
// temporary store, shut down when the test ends.
package natstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/embedded"
	"github.com/wardenhq/warden/streams"
)

// Server is a running test server.
type Server struct {
	*server.Server
	URL string
	Dir string
}

// New starts a server with JetStream on a random port in t.TempDir().
func New(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	srv, err := embedded.Start(embedded.Options{Port: -1, StoreDir: dir, ServerName: "test"})
	if err != nil {
		t.Fatalf("start nats: %v", err)
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return &Server{Server: srv, URL: srv.ClientURL(), Dir: dir}
}

// Connect returns a connection and JetStream context closed at test end.
func (s *Server) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.URL)
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

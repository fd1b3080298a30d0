package api_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/api"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// serve runs s (Server.Run) until the test ends and returns its address.
func serve(t *testing.T, s *api.Server) string {
	t.Helper()
	runCtx, stop := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx, func(a string) { addr <- a }) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case a := <-addr:
		return a
	case err := <-done:
		t.Fatalf("Run: %v", err)
		return ""
	}
}

// A keep-alive connection left idle after its request was kept open for
// good (no IdleTimeout, no ReadTimeout): anyone could hold connections
// without a token. It is closed once idle for the idle timeout.
func TestIdleKeepAliveConnectionIsClosed(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, api.Config{Listen: "127.0.0.1:0"})
	s.SetIdleTimeout(200 * time.Millisecond)
	conn, err := net.Dial("tcp", serve(t, s))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprint(conn, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Close {
		t.Fatalf("GET /healthz: %d, close %v: want 200 on a kept-alive connection", res.StatusCode, res.Close)
	}
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	if _, err := br.ReadByte(); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("an idle keep-alive connection is still open 15 s after its request")
	}
}

// A request body sent slowly held its handler for as long as the client
// liked: io.ReadAll does not see the request's context. The body must
// arrive within the request's timeout (and a margin); a submission whose
// body stops half-way is answered 504 timeout.
func TestSlowRequestBodyIsCut(t *testing.T) {
	t.Parallel()
	s, _ := newServer(t, api.Config{Listen: "127.0.0.1:0", AnonymousScope: api.ScopeAdmin, RequestTimeout: 500 * time.Millisecond})
	conn, err := net.Dial("tcp", serve(t, s))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Content-Length promises 1000 bytes; 24 come.
	if _, err := fmt.Fprint(conn, "POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/yaml\r\n"+
		"Content-Length: 1000\r\n\r\nname: x\nsteps:\n- {id: a"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer 20 s after a body stopped half-way (the handler still waits for it): %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	wantError(t, "a body stopped half-way", response{status: res.StatusCode, body: b}, http.StatusGatewayTimeout, ops.CodeTimeout)
}

// A client that went away mid-request (its context cancelled) was logged
// as the API failing ("request failed") and answered 500 or 503. It is
// not an error of the API: logged at debug only.
func TestClientGoneIsNotLoggedAsAFailure(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	nc, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{TaskShards: 1})
	st, err := jobstore.Open(ctx(t), js)
	if err != nil {
		t.Fatal(err)
	}
	var logs natstest.Buffer
	s, err := api.New(api.Config{AnonymousScope: api.ScopeAdmin}, nc, ops.New(nc, st),
		api.WithLogger(zerolog.New(&logs).Level(zerolog.DebugLevel)))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	// A supervisor leader that takes the failover request and never
	// answers: the handler waits on it until its context ends.
	asked := make(chan struct{}, 1)
	sub, err := nc.Subscribe(protocol.SubjectControlFailover, func(*nats.Msg) { asked <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	cctx, cancel := context.WithCancel(ctx(t))
	req, _ := http.NewRequestWithContext(cctx, "POST", hs.URL+"/api/v1/agents/default/agent-1/failover", nil)
	errc := make(chan error, 1)
	go func() {
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-asked:
	case <-ctx(t).Done():
		t.Fatal("the failover request never reached the supervisor leader")
	}
	cancel() // the client goes away
	<-errc
	natstest.Eventually(t, 10*time.Second, "the handler logs its end", func() bool {
		l := logs.String()
		return strings.Contains(l, "request failed") || strings.Contains(l, "request cancelled")
	})
	if l := logs.String(); strings.Contains(l, "request failed") {
		t.Fatalf("a client going away is logged as a failure: %s", l)
	}
}

package api_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/api"
)

// A request whose Content-Length promises a body that never comes is
// answered, whoever answers it. Reading a body was bounded only once a
// request was authorised: refused before (no token), or served by the
// dashboard or a 404, net/http read the unread body (up to 256 KiB)
// before answering, with no read deadline: the answer never came, and
// the connection and its goroutine were held for as long as the client
// liked, with no token. (Found by a reviewer.)
//
// Old code: "no answer 12 s after the headers (request_timeout 500ms):
// … i/o timeout".
func TestRequestWithAnUnsentBodyIsAnswered(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, req string }{
		{"unauthenticated POST", "POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n"},
		{"dashboard file", "GET /index.html HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n"},
		{"no route", "PUT /api/v1/nothing HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n"},
		{"event stream with a body", "GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + adminToken + "\r\nContent-Length: 100\r\n\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s, _ := newServer(t, api.Config{Listen: "127.0.0.1:0", RequestTimeout: 500 * time.Millisecond,
				Tokens: []api.Token{{Name: "a", Scope: api.ScopeAdmin, Token: adminToken}}})
			conn, err := net.Dial("tcp", serve(t, s))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := fmt.Fprint(conn, c.req); err != nil {
				t.Fatal(err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(12 * time.Second))
			res, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer 12 s after the headers (request_timeout 500ms): %v", err)
			}
			res.Body.Close()
		})
	}
}

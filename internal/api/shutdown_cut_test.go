package api_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/api"
	"github.com/wardenhq/warden/pkg/protocol"
)

// A request still running when the shutdown's grace is about to end is
// answered (504 timeout: it may have been carried out) before its
// connection is closed. A failover whose supervisor answers in 6 s
// (FailoverAgent waits up to 10 s) was cut at the 5 s grace with no answer
// though the failover ran, and a client asked again. (Found by a
// reviewer.)
//
// Old code: "failover in progress at shutdown got no answer: … EOF".
func TestShutdownAnswersARequestItCuts(t *testing.T) {
	t.Parallel()
	s, js := newServer(t, api.Config{Listen: "127.0.0.1:0", AnonymousScope: api.ScopeAdmin})
	nc := js.Conn()
	asked := make(chan struct{}, 1)
	sub, _ := nc.Subscribe(protocol.SubjectControlFailover, func(m *nats.Msg) {
		asked <- struct{}{}
		time.Sleep(6 * time.Second)
		_ = m.Respond(protocol.OKReply("failover f1: 3 tasks moved"))
	})
	defer sub.Unsubscribe()
	runCtx, stop := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx, func(a string) { addr <- a }) }()
	a := <-addr
	type answer struct {
		status int
		err    error
	}
	res := make(chan answer, 1)
	go func() {
		r, err := http.Post("http://"+a+"/api/v1/agents/default/agent-1/failover", "", nil)
		if err != nil {
			res <- answer{err: err}
			return
		}
		r.Body.Close()
		res <- answer{status: r.StatusCode}
	}()
	<-asked
	stop()
	got := <-res
	if got.err != nil {
		t.Fatalf("failover in progress at shutdown got no answer: %v", got.err)
	}
	if got.status != http.StatusGatewayTimeout {
		t.Fatalf("failover cut by the shutdown answered %d, want 504", got.status)
	}
	<-done
}

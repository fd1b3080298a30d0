package api_test

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/api"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Each event stream makes ordered consumers on KV_warden_jobs and
// WARDEN_EVENTS. When the client went they stayed on the server for their
// inactive threshold (30 s), and a client reconnecting piled them up past
// the cap on streams. They are deleted with the stream now. (Found by a
// reviewer.)
//
// Old code: "timed out after 10s: no consumer left on the server" (the
// reviewer's count: KV_warden_jobs 10, WARDEN_EVENTS 10).
func TestEventStreamConsumersEndWithTheStream(t *testing.T) {
	t.Parallel()
	s, js := newServer(t, api.Config{AnonymousScope: api.ScopeRead})
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	for range 10 {
		c, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(c, "GET", hs.URL+"/api/v1/events", nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = bufio.NewReader(res.Body).ReadString('\n')
		cancel()
		res.Body.Close()
	}
	natstest.Eventually(t, 5*time.Second, "every stream closed", func() bool { return s.OpenStreams() == 0 })
	natstest.Eventually(t, 10*time.Second, "no consumer left on the server", func() bool {
		var left []string
		for _, name := range []string{"KV_" + protocol.BucketJobs, protocol.StreamEvents, "KV_" + protocol.BucketPresence} {
			st, err := js.Stream(ctx(t), name)
			if err != nil {
				t.Fatal(err)
			}
			if n := st.CachedInfo().State.Consumers; n > 0 {
				left = append(left, name+": "+strconv.Itoa(n))
			}
		}
		if len(left) > 0 {
			t.Logf("consumers left: %v", left)
		}
		return len(left) == 0
	})
}

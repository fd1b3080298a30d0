package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/protocol"
)

// limit is bounded at 10000, and limit=0 ("the most") is that bound: it
// returned every stored event of the kind (the stream keeps 1 GiB),
// built in memory. (Found by a reviewer.)
//
// Old code: "limit=0 served 10050 events (863243 bytes); limit=10001 is
// refused as too many".
func TestEventListLimitZeroIsTheMost(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const n = 10050
	for i := range n {
		v, _ := json.Marshal(protocol.Event{Kind: protocol.EventHealing, ID: fmt.Sprintf("h%d", i)})
		if _, err := b.js.PublishAsync(protocol.EventSubject(protocol.EventHealing, fmt.Sprintf("h%d", i)), v); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 999 {
			<-b.js.PublishAsyncComplete()
		}
	}
	<-b.js.PublishAsyncComplete()
	wantError(t, "limit=10001", b.call(t, "GET", "/api/v1/healing/actions?limit=10001", readToken, nil), http.StatusBadRequest, ops.CodeInvalid)
	var evs []protocol.Event
	r := b.call(t, "GET", "/api/v1/healing/actions?limit=0", readToken, nil)
	r.decode(t, &evs)
	if len(evs) != 10000 || evs[len(evs)-1].ID != fmt.Sprintf("h%d", n-1) {
		t.Fatalf("limit=0 served %d events (%d bytes); limit=10001 is refused as too many", len(evs), len(r.body))
	}
}

package api_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/protocol"
)

// largestPage is ops.MaxLetterPage, as docs/api.md states it.
const largestPage = 1000

// Listing dead letters served every letter whole, headers and payload (a
// letter may be as large as a NATS message), and limit=0 served them
// all: 40 letters of 900 KB made one 37 MB answer. A dashboard asking
// for 200, oldest first, never saw the newest beyond 200. The list now
// serves summaries (no headers, no payload, the last error cut), limit=0
// is the largest page, and after= pages through them all; the letter
// itself is still served whole.
func TestDeadLetterListServesBoundedSummaries(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	payload := `{"job_id":"job-big","params":"` + strings.Repeat("p", 200<<10) + `"}`
	m := nats.NewMsg(protocol.DLQSubject("default", "agent-big"))
	m.Header.Set(protocol.HeaderJob, "job-big")
	m.Header.Set(protocol.HeaderStep, "a")
	m.Header.Set(protocol.HeaderDLQReason, string(protocol.DLQMaxDeliveries))
	m.Header.Set(protocol.HeaderDLQLastError, strings.Repeat("e", 8000))
	m.Data = []byte(payload)
	ack, err := b.js.PublishMsg(ctx(t), m)
	if err != nil {
		t.Fatal(err)
	}
	big := ack.Sequence
	// A subject keeps its newest 100 letters (streams/dlq.json): the
	// others come from many agents.
	const more = largestPage + 1
	for i := range more {
		m := nats.NewMsg(protocol.DLQSubject("default", fmt.Sprintf("agent-%d", i%20)))
		m.Header.Set(protocol.HeaderJob, fmt.Sprintf("job-%d", i))
		m.Header.Set(protocol.HeaderStep, "a")
		m.Data = []byte(`{}`)
		if _, err := b.js.PublishMsg(ctx(t), m); err != nil {
			t.Fatal(err)
		}
	}

	r := b.call(t, "GET", "/api/v1/queues/dead-letters?limit=1", readToken, nil)
	if r.status != http.StatusOK {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
	var page []map[string]any
	r.decode(t, &page)
	if len(page) != 1 {
		t.Fatalf("limit=1: %d letters", len(page))
	}
	l := page[0]
	if _, ok := l["payload"]; ok {
		t.Errorf("the list serves the letter's payload (%d bytes of answer)", len(r.body))
	}
	if _, ok := l["headers"]; ok {
		t.Errorf("the list serves the letter's headers")
	}
	if e, _ := l["last_error"].(string); len(e) > 600 || !strings.HasPrefix(e, "eee") {
		t.Errorf("last_error of %d bytes in the list, want it cut to about 512", len(e))
	}
	if l["id"] != float64(big) || l["job_id"] != "job-big" || l["reason"] != string(protocol.DLQMaxDeliveries) || l["size"] != float64(len(payload)) {
		t.Errorf("summary: id %v job_id %v reason %v size %v, want %d job-big %s %d", l["id"], l["job_id"], l["reason"], l["size"], big, protocol.DLQMaxDeliveries, len(payload))
	}

	// limit=0 is the largest page, not everything.
	var all []map[string]any
	b.call(t, "GET", "/api/v1/queues/dead-letters?limit=0", readToken, nil).decode(t, &all)
	if len(all) != largestPage {
		t.Errorf("limit=0: %d letters, want the largest page, %d", len(all), largestPage)
	}
	wantError(t, "limit above the largest page", b.call(t, "GET", fmt.Sprintf("/api/v1/queues/dead-letters?limit=%d", largestPage+1), readToken, nil),
		http.StatusBadRequest, ops.CodeInvalid)
	wantError(t, "after=x", b.call(t, "GET", "/api/v1/queues/dead-letters?after=x", readToken, nil), http.StatusBadRequest, ops.CodeInvalid)

	// after= pages through every letter, oldest first, each once.
	var ids []uint64
	var after uint64
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatalf("paging does not end: %d ids so far", len(ids))
		}
		var p []struct {
			ID uint64 `json:"id"`
		}
		r := b.call(t, "GET", fmt.Sprintf("/api/v1/queues/dead-letters?limit=400&after=%d", after), readToken, nil)
		if r.status != http.StatusOK {
			t.Fatalf("page after %d: %d %s", after, r.status, r.body)
		}
		r.decode(t, &p)
		for _, l := range p {
			ids = append(ids, l.ID)
		}
		if len(p) < 400 {
			break
		}
		after = p[len(p)-1].ID
	}
	if len(ids) != more+1 {
		t.Fatalf("paged %d letters, want %d", len(ids), more+1)
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			t.Fatalf("ids not ascending at %d: %d after %d", i, ids[i], ids[i-1])
		}
	}

	// The letter itself is whole.
	var full struct {
		Headers   map[string][]string `json:"headers"`
		Payload   struct{ Params string }
		LastError string `json:"last_error"`
	}
	b.call(t, "GET", fmt.Sprintf("/api/v1/queues/dead-letters/%d", big), readToken, nil).decode(t, &full)
	if len(full.Payload.Params) != 200<<10 || len(full.LastError) != 8000 || len(full.Headers[protocol.HeaderJob]) != 1 {
		t.Errorf("the letter: params %d bytes, last_error %d, headers %d", len(full.Payload.Params), len(full.LastError), len(full.Headers))
	}
}

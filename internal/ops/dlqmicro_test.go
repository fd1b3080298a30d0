package ops_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/pkg/protocol"
)

// dlq.list served whole letters, each with its task's payload: a few large
// letters made a reply past the server's max_payload and the endpoint
// answered nothing at all. It pages summaries, as the HTTP list does.
func TestMicroDeadLetterListPagesSummaries(t *testing.T) {
	t.Parallel()
	nc, _, _ := apiMicro(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const letters = 12 // 12 × 200 KB: past the 1 MB max_payload as whole letters
	var first uint64
	for i := range letters {
		m := nats.NewMsg(protocol.DLQSubject("default", fmt.Sprintf("agent-%d", i)))
		m.Header.Set(protocol.HeaderJob, fmt.Sprintf("job-%d", i))
		m.Header.Set(protocol.HeaderStep, "a")
		m.Data = []byte(`{"params":"` + strings.Repeat("p", 200<<10) + `"}`)
		ack, err := js.PublishMsg(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = ack.Sequence
		}
	}
	list := func(req string) []dlq.Summary {
		t.Helper()
		m, err := nc.Request("warden.ops.api.dlq.list", []byte(req), 5*time.Second)
		if err != nil {
			t.Fatalf("dlq.list %s: %v", req, err)
		}
		if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
			t.Fatalf("dlq.list %s: error %s %s", req, code, m.Data)
		}
		var page []dlq.Summary
		if err := json.Unmarshal(m.Data, &page); err != nil {
			t.Fatalf("dlq.list %s: %v", req, err)
		}
		if len(m.Data) > 64<<10 {
			t.Fatalf("dlq.list %s: %d bytes for %d letters: not summaries", req, len(m.Data), len(page))
		}
		return page
	}
	all := list(`{}`)
	if len(all) != letters || all[0].ID != first || all[0].JobID != "job-0" {
		t.Fatalf("dlq.list {}: %d letters, first %+v; want %d from id %d", len(all), all[0], letters, first)
	}
	page := list(`{"limit": 5}`)
	next := list(fmt.Sprintf(`{"after": %d, "limit": 5}`, page[len(page)-1].ID))
	if len(page) != 5 || len(next) != 5 || next[0].ID != page[4].ID+1 {
		t.Fatalf("pages of 5: %d then %d letters, the second from id %d", len(page), len(next), next[0].ID)
	}
}

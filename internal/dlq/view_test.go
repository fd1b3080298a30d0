package dlq_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/pkg/protocol"
)

// A dead letter is a copy of its task, lease token included (the
// Warden-Token header and the body's "token"); a reader who learns a live
// token can take its result's dedup id first. Get and List leave both
// out and keep everything else of the letter as stored.
func TestLetterViewsHideTheLeaseToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	token := protocol.NewLeaseToken()
	m := nats.NewMsg(protocol.DLQSubject("default", "a1"))
	// The task as the scheduler encodes it, then a member the view must
	// keep as it is, order included; params may hold a "token" of their own.
	m.Data = []byte(`{"job_id":"job-t","step_id":"s","epoch":1,"attempt":1,"action":"echo","params":{"token":"user's own"},` +
		`"timeout":"1m0s","deadline":"2026-11-27T10:00:00Z","token":"` + token + `","extra":[1, 2]}`)
	m.Header.Set(protocol.HeaderJob, "job-t")
	m.Header.Set(protocol.HeaderStep, "s")
	m.Header.Set(protocol.HeaderEpoch, "1")
	m.Header.Set(protocol.HeaderToken, token)
	m.Header.Set(protocol.HeaderDLQReason, string(protocol.DLQMaxDeliveries))
	ack, err := b.js.PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	// A letter whose body is not an object, and one without a token, are
	// shown as stored.
	plain := b.letter(t, "job-u", "s", protocol.DLQPoison, `{"k":1}`)
	list := b.letter(t, "job-v", "s", protocol.DLQPoison, `[{"token":"x"}]`)

	got, err := b.q.Get(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	all, err := b.q.List(ctx, 0)
	if err != nil || len(all) != 3 {
		t.Fatalf("list: %+v %v", all, err)
	}
	for what, l := range map[string]dlq.Letter{"Get": got, "List": all[0]} {
		raw, _ := json.Marshal(l)
		if strings.Contains(string(raw), token) {
			t.Errorf("%s shows the lease token: %s", what, raw)
		}
		if _, ok := l.Headers[protocol.HeaderToken]; ok {
			t.Errorf("%s: header %s in %v", what, protocol.HeaderToken, l.Headers)
		}
		want := `{"job_id":"job-t","step_id":"s","epoch":1,"attempt":1,"action":"echo","params":{"token":"user's own"},` +
			`"timeout":"1m0s","deadline":"2026-11-27T10:00:00Z","extra":[1, 2]}`
		if string(l.Payload) != want {
			t.Errorf("%s payload:\n%s\nwant\n%s", what, l.Payload, want)
		}
		if l.JobID != "job-t" || l.StepID != "s" || l.Epoch != "1" || l.Reason != string(protocol.DLQMaxDeliveries) ||
			l.Headers[protocol.HeaderJob][0] != "job-t" || l.Headers[protocol.HeaderDLQReason][0] != string(protocol.DLQMaxDeliveries) {
			t.Errorf("%s: %+v", what, l)
		}
	}
	if l, err := b.q.Get(ctx, plain); err != nil || string(l.Payload) != `{"k":1}` {
		t.Errorf("letter without a token: %s %v", l.Payload, err)
	}
	if l, err := b.q.Get(ctx, list); err != nil || string(l.Payload) != `[{"token":"x"}]` {
		t.Errorf("letter that is not an object: %s %v", l.Payload, err)
	}
	// The stored letter keeps its token: only the view leaves it out.
	s, err := b.js.Stream(ctx, protocol.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	if raw, err := s.GetMsg(ctx, ack.Sequence); err != nil || raw.Header.Get(protocol.HeaderToken) != token {
		t.Fatalf("stored letter: %v %v", raw, err)
	}
}

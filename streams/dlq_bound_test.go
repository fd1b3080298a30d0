package streams_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// WARDEN_DLQ is bounded, so that no writer of dead letters (every agent, on
// its own subject) can fill the server's store: a total, a per-agent share
// well below it, and a largest letter that still takes a 1 MiB task with a
// 1 MiB last error. When full it drops the oldest letters: a park is never
// refused for space.
func TestDeadLetterStreamIsBounded(t *testing.T) {
	cs, err := streams.StreamConfigs(streams.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var def *jetstream.StreamConfig
	for i := range cs {
		if cs[i].Name == protocol.StreamDLQ {
			def = &cs[i]
		}
	}
	if def == nil {
		t.Fatalf("no %s definition", protocol.StreamDLQ)
	}
	const mib = 1 << 20
	switch c := *def; {
	case c.MaxBytes <= 0 || c.MaxBytes > 1<<30:
		t.Fatalf("max_bytes %d, want a bound of at most 1 GiB", c.MaxBytes)
	case c.MaxMsgsPerSubject <= 0:
		t.Fatalf("max_msgs_per_subject %d, want a per-agent bound", c.MaxMsgsPerSubject)
	case c.MaxMsgSize < 2*mib:
		t.Fatalf("max_msg_size %d, want room for a 1 MiB task and a 1 MiB last error", c.MaxMsgSize)
	case c.MaxMsgsPerSubject*int64(c.MaxMsgSize) > c.MaxBytes/4:
		t.Fatalf("one agent may hold %d letters of %d bytes, more than a quarter of max_bytes %d", c.MaxMsgsPerSubject, c.MaxMsgSize, c.MaxBytes)
	case c.Discard != jetstream.DiscardOld || c.DiscardNewPerSubject:
		t.Fatalf("discard %v (new per subject %v), want old: a full dead-letter stream must not refuse parks", c.Discard, c.DiscardNewPerSubject)
	}

	_, _, js := natstest.Start(t, streams.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, protocol.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.MaxBytes != def.MaxBytes || c.MaxMsgsPerSubject != def.MaxMsgsPerSubject ||
		c.MaxMsgSize != def.MaxMsgSize || c.Discard != jetstream.DiscardOld {
		t.Fatalf("applied %s: max_bytes %d, max_msgs_per_subject %d, max_msg_size %d, discard %v; want the definition's",
			protocol.StreamDLQ, c.MaxBytes, c.MaxMsgsPerSubject, c.MaxMsgSize, c.Discard)
	}

	// One agent's flood keeps its newest letters and leaves another's.
	other, err := js.Publish(ctx, protocol.DLQSubject("default", "a2"), []byte("a2's letter"))
	if err != nil {
		t.Fatal(err)
	}
	n := int(def.MaxMsgsPerSubject) + 5
	var msgs []*nats.Msg
	for i := range n {
		m := nats.NewMsg(protocol.DLQSubject("default", "a1"))
		m.Data = fmt.Appendf(nil, "letter %d", i)
		msgs = append(msgs, m)
	}
	natstest.PublishAll(t, js, msgs...) // every letter acknowledged: none refused
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(protocol.DLQSubject("default", ">")))
	if err != nil {
		t.Fatal(err)
	}
	if got := info.State.Subjects[protocol.DLQSubject("default", "a1")]; got != uint64(def.MaxMsgsPerSubject) {
		t.Fatalf("a1 holds %d letters after publishing %d, want %d", got, n, def.MaxMsgsPerSubject)
	}
	if m, err := s.GetMsg(ctx, other.Sequence); err != nil || string(m.Data) != "a2's letter" {
		t.Fatalf("a2's letter after a1's flood: %v", err)
	}
	last, err := s.GetLastMsgForSubject(ctx, protocol.DLQSubject("default", "a1"))
	if err != nil || string(last.Data) != fmt.Sprintf("letter %d", n-1) {
		t.Fatalf("a1's newest letter: %v %v", last, err)
	}
}

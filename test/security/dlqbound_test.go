package security

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/creds"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// TestAgentCannotFloodDeadLetters: an agent may publish dead letters on
// its own warden.dlq.<pool>.<agent> as often as it likes, but WARDEN_DLQ
// keeps only its newest max_msgs_per_subject of them (and at most 1 GiB in
// all), so it cannot fill the server's store; another agent's letter stays,
// and no letter is refused for space.
func TestAgentCannotFloodDeadLetters(t *testing.T) {
	d := start(t, pool+".a1", pool+".a2")
	d.setupStreams(t)
	cs, err := streams.StreamConfigs(streams.Options{TaskShards: shards})
	if err != nil {
		t.Fatal(err)
	}
	var bound int64
	for _, c := range cs {
		if c.Name == protocol.StreamDLQ {
			bound = c.MaxMsgsPerSubject
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a1 := d.connect(t, creds.AgentIdentity(pool, "a1"))
	a2 := d.connect(t, creds.AgentIdentity(pool, "a2"))
	kept, err := a2.js.Publish(ctx, protocol.DLQSubject(pool, "a2"), []byte("a2's letter"))
	if err != nil {
		t.Fatal(err)
	}
	n := int(max(bound, 100)) + 20
	futures := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		m := nats.NewMsg(protocol.DLQSubject(pool, "a1"))
		m.Data = fmt.Appendf(nil, "letter %d", i)
		f, err := a1.js.PublishMsgAsync(m)
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatalf("a1's letter %d refused: %v", i, err)
		case <-ctx.Done():
			t.Fatalf("a1's letter %d: no PubAck", i)
		}
	}
	r := d.connect(t, creds.RoleReadonly)
	s, err := r.js.Stream(ctx, protocol.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(protocol.DLQSubject(pool, ">")))
	if err != nil {
		t.Fatal(err)
	}
	if got := info.State.Subjects[protocol.DLQSubject(pool, "a1")]; bound <= 0 || got != uint64(bound) {
		t.Fatalf("a1 holds %d letters after publishing %d, want its newest %d", got, n, bound)
	}
	if m, err := s.GetMsg(ctx, kept.Sequence); err != nil || string(m.Data) != "a2's letter" {
		t.Fatalf("a2's letter after a1's flood: %v", err)
	}
	for _, c := range []*conn{a1, a2, r} {
		if got := c.refusals(); len(got) != 0 {
			t.Fatalf("%s: permission refusals %v", c.identity, got)
		}
	}
}

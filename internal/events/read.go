package events

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// List reads the stored events of one kind, oldest first, keeping the last
// limit of them (0: all). It reads with an ordered consumer and stops at
// the end of what is stored.
func List(ctx context.Context, js jetstream.JetStream, kind protocol.EventKind, limit int) ([]protocol.Event, error) {
	s, err := js.Stream(ctx, protocol.StreamEvents)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", protocol.StreamEvents, err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{protocol.EventSubject(kind, ">")}})
	if err != nil {
		return nil, fmt.Errorf("read %s events: %w", kind, err)
	}
	var out []protocol.Event
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(300 * time.Millisecond))
		if err != nil {
			break // nothing more within the wait: the end of what is stored
		}
		var e protocol.Event
		if json.Unmarshal(m.Data(), &e) == nil {
			out = append(out, e)
		}
		if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
			break
		}
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, nil
}

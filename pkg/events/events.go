// Package events publishes Warden's audit trail to the WARDEN_EVENTS stream.
// An event is published with a JetStream publish and the PubAck awaited, so
// an event a caller was told about is durable.
package events

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Publisher writes events.
type Publisher struct {
	js  jetstream.JetStream
	now func() time.Time
}

// NewPublisher returns a publisher using js.
func NewPublisher(js jetstream.JetStream) *Publisher {
	return &Publisher{js: js, now: time.Now}
}

// Publish stores e under warden.event.<kind>.<id>, filling Time if unset.
func (p *Publisher) Publish(ctx context.Context, e protocol.Event) error {
	if e.Time.IsZero() {
		e.Time = p.now().UTC()
	}
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode event %s: %w", e.Kind, err)
	}
	id := e.ID
	if !protocol.ValidToken(id) {
		id = "_"
	}
	msg := nats.NewMsg(protocol.EventSubject(e.Kind, id))
	msg.Data = b
	if _, err := p.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("publish event %s %s: %w", e.Kind, e.ID, err)
	}
	return nil
}

package events

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
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

// Publish stores e under warden.event.<kind>.<id>, filling Time if unset,
// with the Nats-Msg-Id MsgID(e).
func (p *Publisher) Publish(ctx context.Context, e protocol.Event) error {
	return p.publish(ctx, e, MsgID(e))
}

// PublishOnce is Publish for an event whose body carries measurements that
// differ between two descriptions of the same thing (a failover's
// duration): its Nats-Msg-Id is derived from its kind, its id and
// occurrence, a name of the thing it describes, alone.
func (p *Publisher) PublishOnce(ctx context.Context, e protocol.Event, occurrence string) error {
	return p.publish(ctx, e, string(e.Kind)+"."+subjectID(e.ID)+"."+digest(occurrence))
}

func (p *Publisher) publish(ctx context.Context, e protocol.Event, msgID string) error {
	if e.Time.IsZero() {
		e.Time = p.now().UTC()
	}
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode event %s: %w", e.Kind, err)
	}
	msg := nats.NewMsg(protocol.EventSubject(e.Kind, subjectID(e.ID)))
	msg.Data = b
	msg.Header.Set(protocol.HeaderMsgID, msgID)
	if _, err := p.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("publish event %s %s: %w", e.Kind, e.ID, err)
	}
	return nil
}

// MsgID is the Nats-Msg-Id of an event: its kind and id and a digest of
// everything else it says but its time. Two events that describe the same
// thing in the same words have the same id; an event about a new
// occurrence must say what distinguishes it (an epoch, a heartbeat time).
func MsgID(e protocol.Event) string {
	h := sha256.New()
	for _, s := range []string{string(e.Kind), e.ID, e.JobID, e.StepID, e.Agent, e.Reason} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	keys := make([]string, 0, len(e.Data))
	for k := range e.Data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		h.Write([]byte(k))
		h.Write([]byte{0})
		h.Write([]byte(e.Data[k]))
		h.Write([]byte{0})
	}
	return string(e.Kind) + "." + subjectID(e.ID) + "." + hex.EncodeToString(h.Sum(nil)[:12])
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:12])
}

// subjectID is the id as it appears in the subject: "_" if it is not a
// valid subject token.
func subjectID(id string) string {
	if !protocol.ValidToken(id) {
		return "_"
	}
	return id
}

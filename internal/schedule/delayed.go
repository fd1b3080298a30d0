package schedule

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// PublishDelayed publishes a submission of job (msg, addressed to
// warden.submit.<job>, with its headers and spec) so that it reaches the
// scheduler at `at` and not before: it goes to warden.delay.<job> in
// WARDEN_DELAY as a one-shot JetStream message schedule that the server
// releases onto warden.delayed.<job> at that time, and a delay relay
// (DelayRelay) submits it again on warden.submit.<job>. Nats-Msg-Id still
// deduplicates. A time already past publishes msg at once. Only schedulers
// may publish here (docs/security.md).
func PublishDelayed(ctx context.Context, js jetstream.JetStream, msg *nats.Msg, at time.Time) (*jetstream.PubAck, error) {
	job, ok := strings.CutPrefix(msg.Subject, protocol.SubjectSubmit+".")
	if !ok || !protocol.ValidToken(job) {
		return nil, fmt.Errorf("delayed submission: subject %q is not %s.<job>", msg.Subject, protocol.SubjectSubmit)
	}
	if !at.After(time.Now()) {
		return js.PublishMsg(ctx, msg)
	}
	d := nats.NewMsg(protocol.DelaySubject(job))
	d.Data = msg.Data
	for k, v := range msg.Header {
		d.Header[k] = v
	}
	d.Header.Set(protocol.HeaderNatsSchedule, "@at "+at.UTC().Format(time.RFC3339Nano))
	d.Header.Set(protocol.HeaderNatsScheduleTarget, protocol.DelayedSubject(job))
	return js.PublishMsg(ctx, d)
}

// Resubmission is a submission of job with body data and the headers of h
// that are Warden's (not the server's Nats-* ones: a message id, schedule
// or roll-up header of the message it comes from must not ride along).
func Resubmission(job string, data []byte, h nats.Header) *nats.Msg {
	m := nats.NewMsg(protocol.SubmitSubject(job))
	m.Data = data
	for k, v := range h {
		if !strings.HasPrefix(k, "Nats-") {
			m.Header[k] = v
		}
	}
	m.Header.Set(protocol.HeaderJobID, job)
	return m
}

// Released reports whether a submission was released by a message
// schedule (a delayed submission or a schedule's tick) rather than
// published directly: the scheduler must not delay it again.
func Released(h nats.Header) bool {
	return h.Get(protocol.HeaderNatsScheduler) != "" || h.Get(protocol.HeaderScheduleTick) != "" || h.Get(protocol.HeaderReleased) != ""
}

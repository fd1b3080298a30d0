package schedule

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Trigger submits the job of the schedule name once, now, outside its
// cadence, and returns the job's id: TriggerID of the name and the
// server's time, which no tick's id can be. A paused schedule is
// triggered too; its timer is left alone. An unknown name is ErrNotFound.
// Two triggers in the same millisecond are one job (the same id).
func (s *Store) Trigger(ctx context.Context, name string) (string, error) {
	e, err := s.Get(ctx, name)
	if err != nil {
		return "", err
	}
	now, err := s.serverTime(ctx)
	if err != nil {
		return "", err
	}
	job := TriggerID(name, now)
	if err := submitJob(ctx, s.js, e.Definition, job, time.Time{}); err != nil {
		return "", err
	}
	return job, nil
}

// submitJob publishes the spec of d as job. The job id is also the
// Nats-Msg-Id, so a second submission of the same job makes no second
// one. A tick's submission carries the tick (Warden-Schedule-Tick); a
// trigger's, zero, none.
func submitJob(ctx context.Context, js jetstream.JetStream, d Definition, job string, tick time.Time) error {
	msg := nats.NewMsg(protocol.SubmitSubject(job))
	msg.Data = []byte(d.Spec)
	msg.Header.Set(protocol.HeaderJobID, job)
	msg.Header.Set(protocol.HeaderMsgID, job)
	msg.Header.Set(protocol.HeaderSchedule, d.Name)
	if !tick.IsZero() {
		msg.Header.Set(protocol.HeaderScheduleTick, tick.UTC().Format(time.RFC3339Nano))
	}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("submit %s: %w", job, err)
	}
	return nil
}

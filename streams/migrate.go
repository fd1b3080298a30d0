package streams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// migrateSubmit moves a WARDEN_SUBMIT made before WARDEN_DELAY existed to
// the current shape. That stream held delayed submissions itself, as
// message schedules, and so had to allow roll-ups, which let any publisher
// purge every queued submission with "Nats-Rollup: all". The server will
// not turn message schedules off on a stream, so the stream is made again:
// its delayed submissions (warden.delay.<job>) are copied to WARDEN_DELAY
// (their target rewritten to warden.delayed.<job>) and deleted, and the
// stream is deleted if nothing else waits in it; the caller then creates it
// anew. With submissions queued it refuses, naming them: let the
// schedulers of the old version take them first.
func migrateSubmit(ctx context.Context, js jetstream.JetStream, defs []jetstream.StreamConfig) error {
	old, err := js.Stream(ctx, protocol.StreamSubmit)
	if err != nil || !old.CachedInfo().Config.AllowMsgSchedules {
		return nil // new, or already the current shape
	}
	// Queued submissions would be lost with the stream: refuse first, with
	// nothing changed.
	if err := nothingQueued(ctx, old); err != nil {
		return err
	}
	// WARDEN_DELAY takes warden.delay.*: the old stream lets go of it (its
	// messages stay) before the new one is made.
	cfg := old.CachedInfo().Config
	cfg.Subjects = slices.DeleteFunc(slices.Clone(cfg.Subjects), func(s string) bool { return s == protocol.DelaySubject("*") })
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return setupError(protocol.StreamSubmit, fmt.Errorf("release warden.delay.* (needs the setup identity: `warden setup`): %w", err))
	}
	for _, c := range defs {
		if c.Name == protocol.StreamDelay {
			if err := ensureStream(ctx, js, c); err != nil {
				return err
			}
		}
	}
	info, err := old.Info(ctx, jetstream.WithSubjectFilter(protocol.DelaySubject("*")))
	if err != nil {
		return setupError(protocol.StreamSubmit, fmt.Errorf("list delayed submissions: %w", err))
	}
	for subject := range info.State.Subjects {
		m, err := old.GetLastMsgForSubject(ctx, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // released meanwhile
		}
		if err != nil {
			return setupError(protocol.StreamSubmit, fmt.Errorf("read %s: %w", subject, err))
		}
		job := strings.TrimPrefix(subject, protocol.SubjectDelayPrefix+".")
		msg := &nats.Msg{Subject: subject, Data: m.Data, Header: m.Header}
		msg.Header.Set(protocol.HeaderNatsScheduleTarget, protocol.DelayedSubject(job))
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			return setupError(protocol.StreamDelay, fmt.Errorf("copy %s: %w", subject, err))
		}
		if err := DeleteMsg(ctx, old, m.Sequence); err != nil {
			return setupError(protocol.StreamSubmit, fmt.Errorf("delete the moved %s: %w", subject, err))
		}
	}
	// One released while it was moved lands in the old stream: it waits to
	// be taken, as any queued submission.
	if err := nothingQueued(ctx, old); err != nil {
		return err
	}
	if err := js.DeleteStream(ctx, protocol.StreamSubmit); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return setupError(protocol.StreamSubmit, fmt.Errorf("delete it to make it again without roll-ups (needs the setup identity: `warden setup`): %w", err))
	}
	return nil
}

// nothingQueued refuses while the old stream holds submissions (anything
// but its anchor and its delayed submissions, which are moved).
func nothingQueued(ctx context.Context, old jetstream.Stream) error {
	waiting, err := stored(ctx, old, ">", func(subject string) bool {
		return subject == protocol.AnchorSubject(protocol.StreamSubmit) || strings.HasPrefix(subject, protocol.SubjectDelayPrefix+".")
	})
	if err != nil {
		return setupError(protocol.StreamSubmit, err)
	}
	if waiting > 0 {
		return setupError(protocol.StreamSubmit, fmt.Errorf("this version keeps delayed submissions in %s and must make %s again "+
			"(the server will not turn message schedules off), but %d submissions wait in it: run the previous version's "+
			"schedulers until it is empty, then start this one (delayed submissions are moved by themselves)",
			protocol.StreamDelay, protocol.StreamSubmit, waiting))
	}
	return nil
}

package streams_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// oldSubmit makes WARDEN_SUBMIT as the previous version did: delayed
// submissions held in it as message schedules, so roll-ups allowed.
func oldSubmit(t *testing.T, ctx context.Context, js jetstream.JetStream) jetstream.Stream {
	t.Helper()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: protocol.StreamSubmit, Subjects: []string{"warden.submit", "warden.submit.*", "warden.delay.*"},
		Retention: jetstream.WorkQueuePolicy, AllowRollup: true, AllowMsgSchedules: true, Discard: jetstream.DiscardOld,
		Duplicates: 2 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	d := nats.NewMsg(protocol.DelaySubject("later"))
	d.Data = []byte(`{"name":"later","steps":[{"id":"a","action":"echo"}]}`)
	d.Header.Set(protocol.HeaderJobID, "later")
	d.Header.Set(protocol.HeaderNatsSchedule, "@at "+time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	d.Header.Set(protocol.HeaderNatsScheduleTarget, protocol.SubmitSubject("later"))
	if _, err := js.PublishMsg(ctx, d); err != nil {
		t.Fatal(err)
	}
	return st
}

// A WARDEN_SUBMIT of the previous version (message schedules, so roll-ups
// allowed) is made again: its delayed submissions move to WARDEN_DELAY,
// aimed at warden.delayed.<job>, and the new stream refuses roll-ups.
func TestEnsureMigratesTheOldSubmitStream(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	oldSubmit(t, ctx, js)
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatalf("Ensure over the old stream: %v", err)
	}
	st, err := js.Stream(ctx, protocol.StreamSubmit)
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; c.AllowMsgSchedules || c.AllowRollup {
		t.Fatalf("WARDEN_SUBMIT still allows schedules %v / roll-ups %v", c.AllowMsgSchedules, c.AllowRollup)
	}
	delay, err := js.Stream(ctx, protocol.StreamDelay)
	if err != nil {
		t.Fatal(err)
	}
	m, err := delay.GetLastMsgForSubject(ctx, protocol.DelaySubject("later"))
	if err != nil {
		t.Fatalf("the delayed submission was not moved: %v", err)
	}
	if got := m.Header.Get(protocol.HeaderNatsScheduleTarget); got != protocol.DelayedSubject("later") || m.Header.Get(protocol.HeaderJobID) != "later" {
		t.Fatalf("moved with target %q, headers %v", got, m.Header)
	}
}

// Submissions queued in the old stream would be lost with it: Ensure
// refuses, naming them, and leaves the stream as it is.
func TestEnsureDoesNotMigrateOverQueuedSubmissions(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := oldSubmit(t, ctx, js)
	if _, err := js.Publish(ctx, protocol.SubmitSubject("queued"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	err := streams.Ensure(ctx, js, streams.Options{})
	if err == nil || !strings.Contains(err.Error(), "1 submissions wait") {
		t.Fatalf("Ensure over a queued submission: %v, want a refusal", err)
	}
	if _, err := st.GetLastMsgForSubject(ctx, protocol.SubmitSubject("queued")); err != nil {
		t.Fatalf("the queued submission: %v", err)
	}
}

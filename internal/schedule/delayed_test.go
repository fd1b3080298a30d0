package schedule_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// TestDelayedSubmissionReleasedOnTime: a submission delayed by 2 s (held
// in WARDEN_DELAY, released by the server, submitted again by the delay
// relay) reaches warden.submit.<job> (its partition) no earlier than 2 s
// after it was accepted, with its headers and body intact, and the held
// copy is gone.
func TestDelayedSubmissionReleasedOnTime(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.Start(t, streams.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	relayed := make(chan error, 1)
	go func() { relayed <- schedule.RunDelayRelay(ctx, js, zerolog.Nop()) }()
	defer func() {
		cancel()
		if err := <-relayed; err != nil {
			t.Errorf("delay relay: %v", err)
		}
	}()
	cons, err := js.CreateConsumer(ctx, protocol.StreamSubmit, jetstream.ConsumerConfig{
		Durable: "test", FilterSubject: protocol.SubjectSubmit + ".*.*", AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(protocol.SubmitSubject("later-1"))
	msg.Data = []byte(`{"name":"later","delay":"2s","steps":[{"id":"a","action":"echo"}]}`)
	msg.Header.Set(protocol.HeaderJobID, "later-1")
	msg.Header.Set(protocol.HeaderMsgID, "later-1")
	accepted := time.Now()
	at := accepted.Add(2 * time.Second)
	ack, err := schedule.PublishDelayed(ctx, js, msg, at)
	if err != nil {
		t.Fatal(err)
	}
	if ack.Stream != protocol.StreamDelay {
		t.Fatalf("accepted by %s, want %s", ack.Stream, protocol.StreamDelay)
	}
	// A second publish of the same submission is a duplicate.
	if ack2, err := schedule.PublishDelayed(ctx, js, msg, at); err != nil || !ack2.Duplicate {
		t.Fatalf("resubmission: %+v %v, want a duplicate", ack2, err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got jetstream.Msg
	for m := range batch.Messages() {
		got = m
	}
	if got == nil {
		t.Fatal("the delayed submission was never released")
	}
	received := time.Now()
	md, err := got.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if md.Timestamp.Before(at) {
		t.Fatalf("released at %s, %s before its time", md.Timestamp, at.Sub(md.Timestamp))
	}
	want := protocol.SubjectSubmit + "." + strconv.Itoa(protocol.Partition("later-1", streams.DefaultPartitions)) + ".later-1"
	if got.Subject() != want {
		t.Fatalf("released onto %s, want %s", got.Subject(), want)
	}
	if got.Headers().Get(protocol.HeaderJobID) != "later-1" || string(got.Data()) != string(msg.Data) {
		t.Fatalf("headers or body changed: %v %s", got.Headers(), got.Data())
	}
	if !schedule.Released(got.Headers()) {
		t.Fatal("a released submission must say so")
	}
	t.Logf("delay 2s: released %s after acceptance (%s after its time), received %s after its time",
		md.Timestamp.Sub(accepted).Round(time.Millisecond), md.Timestamp.Sub(at).Round(time.Millisecond), received.Sub(at).Round(time.Millisecond))
	_ = got.Ack()
	st, err := js.Stream(ctx, protocol.StreamDelay)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, "the held copy and its release are removed", func() bool {
		_, err1 := st.GetLastMsgForSubject(ctx, protocol.DelaySubject("later-1"))
		_, err2 := st.GetLastMsgForSubject(ctx, protocol.DelayedSubject("later-1"))
		return err1 != nil && err2 != nil
	})
}

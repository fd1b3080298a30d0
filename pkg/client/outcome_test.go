package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// TestKeyTheHeaderWouldChangeIsRefused: "k" and "k\n" are one Nats-Msg-Id
// once a NATS client has trimmed the header value, and two job ids. The
// second submission was dropped by the server as a duplicate of the first
// and reported as an existing job that never existed; now its key is
// refused before anything is published.
func TestKeyTheHeaderWouldChangeIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	withKey := func(key string) []byte {
		body, _ := json.Marshal(map[string]any{"name": "x", "idempotency_key": key, "steps": []any{map[string]string{"id": "a", "action": "echo"}}})
		return body
	}
	first, err := b.client.Submit(ctx(t), withKey("k"), client.SubmitOptions{NoReply: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"k\n", "k ", " k", "\tk"} {
		r, err := b.client.Submit(ctx(t), withKey(key), client.SubmitOptions{NoReply: true})
		if spec.ReasonOf(err) != spec.ReasonInvalidValue {
			t.Fatalf("key %q after %q: receipt %+v (job %s, the first is %s), %v; want invalid_value", key, "k", r, r.JobID, first.JobID, err)
		}
	}
	if n := submitted(t, b.js); n != 1 {
		t.Fatalf("%d submissions stored, want 1", n)
	}
}

// swallow stands in for a server that stores a submission and whose
// PubAck is lost: it takes every publish on the submit subjects and never
// answers. It returns the job ids it received.
func swallow(t *testing.T, nc *nats.Conn) <-chan string {
	t.Helper()
	got := make(chan string, 8)
	sub, err := nc.Subscribe(protocol.SubjectSubmit+".>", func(m *nats.Msg) { got <- m.Header.Get(protocol.HeaderJobID) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestSubmitWithoutPubAckNamesTheJob: the server took the submission and
// no PubAck came before the caller's deadline. Submit cannot say whether
// the job was stored; it says so (ErrOutcomeUnknown, with the cause) and
// names the job, so the caller can look for it instead of submitting a
// second job.
func TestSubmitWithoutPubAckNamesTheJob(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t) // no streams: only the swallower answers
	nc, js := srv.Connect(t)
	got := swallow(t, nc)
	c := client.New(js, client.Options{})
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := c.Submit(sctx, []byte(diamond), client.SubmitOptions{})
	var sent string
	select {
	case sent = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the submission was not published")
	}
	if r.JobID == "" || r.JobID != sent || r.Name != "deploy" {
		t.Fatalf("receipt %+v, want job %s (the one published)", r, sent)
	}
	if !errors.Is(err, client.ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want ErrOutcomeUnknown caused by the deadline", err)
	}
	var oe *client.OutcomeUnknownError
	if !errors.As(err, &oe) || oe.JobID != sent {
		t.Fatalf("error %#v, want an *OutcomeUnknownError naming %s", err, sent)
	}
}

// TestSubmitWithNoStreamIsNotUnknown: nothing listens on the submit
// subjects, so nothing was stored: that is ErrNoSubmitStream, not an
// unknown outcome.
func TestSubmitWithNoStreamIsNotUnknown(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	r, err := client.New(js, client.Options{}).Submit(ctx(t), []byte(diamond), client.SubmitOptions{})
	if !errors.Is(err, client.ErrNoSubmitStream) || errors.Is(err, client.ErrOutcomeUnknown) || r.JobID != "" {
		t.Fatalf("%+v, %v; want ErrNoSubmitStream and no receipt", r, err)
	}
}

// TestSubmitInterruptedWhileWaitingNamesTheJob: the caller's context ends
// while Submit waits for the scheduler's reply; the job is stored, and the
// receipt and the error say which.
func TestSubmitInterruptedWhileWaitingNamesTheJob(t *testing.T) {
	t.Parallel()
	b := setup(t) // no scheduler: no reply comes
	sctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// Ctrl-C once the server has stored the submission.
		defer cancel()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if s, err := b.js.Stream(sctx, protocol.StreamSubmit); err == nil {
				if info, err := s.Info(sctx); err == nil && info.State.Msgs == 1 {
					return
				}
			}
		}
	}()
	r, err := b.client.Submit(sctx, []byte(diamond), client.SubmitOptions{ReplyTimeout: time.Minute})
	if !errors.Is(err, context.Canceled) || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("error %v, want the interrupt", err)
	}
	if r.JobID == "" || r.Sequence == 0 || r.Confirmed {
		t.Fatalf("receipt %+v, want the stored job, unconfirmed", r)
	}
	if !strings.Contains(err.Error(), r.JobID) {
		t.Fatalf("error %q does not name job %s", err, r.JobID)
	}
}

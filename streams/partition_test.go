package streams_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// The submit and results streams store a job's messages under its
// partition, which clients compute with protocol.Partition.
func TestSubjectsAreStoredUnderTheJobsPartition(t *testing.T) {
	_, _, js := natstest.Start(t, streams.Options{Partitions: 8})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, job := range []string{"a", "job-1", "0123456789abcdef", "x_y"} {
		p := protocol.Partition(job, 8)
		if _, err := js.Publish(ctx, protocol.SubmitSubject(job), []byte("{}")); err != nil {
			t.Fatal(err)
		}
		s, _ := js.Stream(ctx, protocol.StreamSubmit)
		m, err := s.GetLastMsgForSubject(ctx, protocol.SubjectSubmit+".*.*")
		if err != nil {
			t.Fatal(err)
		}
		if want := protocol.SubjectSubmit + "." + itoa(p) + "." + job; m.Subject != want {
			t.Fatalf("submission of %s stored as %s, want %s", job, m.Subject, want)
		}
		if _, err := js.Publish(ctx, protocol.ResultSubject("pool", "ag", job, "s1"), []byte("{}")); err != nil {
			t.Fatal(err)
		}
		r, _ := js.Stream(ctx, protocol.StreamResults)
		m, err = r.GetLastMsgForSubject(ctx, protocol.StoredResultFilter(p))
		if err != nil {
			t.Fatalf("result of %s not under partition %d: %v", job, p, err)
		}
		if want := "warden.result." + itoa(p) + ".pool.ag." + job + ".s1"; m.Subject != want {
			t.Fatalf("result stored as %s, want %s", m.Subject, want)
		}
	}
	// The bare subject is stored as it is.
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: protocol.SubjectSubmit, Data: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	s, _ := js.Stream(ctx, protocol.StreamSubmit)
	if _, err := s.GetLastMsgForSubject(ctx, protocol.SubjectSubmit); err != nil {
		t.Fatalf("bare submission: %v", err)
	}
	_ = jetstream.ErrMsgNotFound
}

func itoa(i int) string { return string(rune('0' + i)) }

// Lowering partitions (the documented change: stop everything, delete the
// deployment record, start with the new count) left submissions queued on
// the partitions that went unread for good: accepted jobs that never end.
// Ensure refuses it while any wait there, and allows it once none does.
func TestLoweringPartitionsRefusesToStrandMessages(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, js, streams.Options{Partitions: 16}); err != nil {
		t.Fatal(err)
	}
	job := ""
	for i := 0; job == ""; i++ {
		if id := "job-" + strconv.Itoa(i); protocol.Partition(id, 16) >= 8 {
			job = id
		}
	}
	if _, err := js.Publish(ctx, protocol.SubmitSubject(job), []byte(`{"name":"x","steps":[{"id":"a","action":"echo"}]}`)); err != nil {
		t.Fatal(err)
	}
	lower := func() error {
		kv, err := js.KeyValue(ctx, protocol.BucketDeployment)
		if err != nil {
			t.Fatal(err)
		}
		if err := kv.Delete(ctx, protocol.KeyDeployment); err != nil {
			t.Fatal(err)
		}
		return streams.Ensure(ctx, js, streams.Options{Partitions: 8})
	}
	err := lower()
	if err == nil || !strings.Contains(err.Error(), "strand 1 messages") {
		t.Fatalf("lowering partitions over a queued submission: %v, want a refusal naming it", err)
	}
	// Refused before the deployment record is written: processes with the
	// old count may still start and drain the queue (the refusal wrote a
	// record with the new count, which then refused them).
	if kv, err := js.KeyValue(ctx, protocol.BucketDeployment); err != nil {
		t.Fatal(err)
	} else if _, err := kv.Get(ctx, protocol.KeyDeployment); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("deployment record after the refusal: %v, want none written", err)
	}
	s, _ := js.Stream(ctx, protocol.StreamSubmit)
	if m, err := s.GetLastMsgForSubject(ctx, protocol.SubjectSubmit+".*."+job); err != nil {
		t.Fatalf("the queued submission: %v", err)
	} else if err := s.DeleteMsg(ctx, m.Sequence); err != nil { // as a scheduler with 16 partitions would take it
		t.Fatal(err)
	}
	if err := lower(); err != nil {
		t.Fatalf("lowering partitions over empty queues: %v", err)
	}
}

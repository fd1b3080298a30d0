package jobstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// scriptedJS is a JetStream whose ordered consumers deliver msgs, in
// order, instead of what the stream holds: the interleavings of a scan
// with writes and expiries that a live server produces only by chance.
type scriptedJS struct {
	jetstream.JetStream
	msgs []jetstream.Msg
}

func (s *scriptedJS) OrderedConsumer(context.Context, string, jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	return &scriptedConsumer{msgs: s.msgs}, nil
}

func (s *scriptedJS) DeleteConsumer(context.Context, string, string) error { return nil }

type scriptedConsumer struct {
	jetstream.Consumer
	msgs []jetstream.Msg
}

func (c *scriptedConsumer) CachedInfo() *jetstream.ConsumerInfo {
	return &jetstream.ConsumerInfo{Name: "scripted", NumPending: uint64(len(c.msgs))}
}

func (c *scriptedConsumer) Messages(...jetstream.PullMessagesOpt) (jetstream.MessagesContext, error) {
	return &scriptedIter{msgs: c.msgs}, nil
}

type scriptedIter struct {
	msgs []jetstream.Msg
}

func (it *scriptedIter) Next(...jetstream.NextOpt) (jetstream.Msg, error) {
	if len(it.msgs) == 0 {
		return nil, jetstream.ErrMsgIteratorClosed
	}
	m := it.msgs[0]
	it.msgs = it.msgs[1:]
	return m, nil
}

func (it *scriptedIter) Stop()  {}
func (it *scriptedIter) Drain() {}

// scriptedMsg is one message of the jobs stream as a scan receives it
// (headers only).
type scriptedMsg struct {
	jetstream.Msg
	subject string
	header  nats.Header
	md      jetstream.MsgMetadata
}

func (m *scriptedMsg) Subject() string                           { return m.subject }
func (m *scriptedMsg) Headers() nats.Header                      { return m.header }
func (m *scriptedMsg) Metadata() (*jetstream.MsgMetadata, error) { return &m.md, nil }

// A job whose record the scan read, and whose removal (its retention
// ended, or a delete) it then read too, is gone: it was kept, counted in
// Matched and Counts, and left a hole in its page.
func TestScanDropsAJobRemovedWhileItRuns(t *testing.T) {
	t.Parallel()
	st, js := newStore(t)
	ctx := testCtx(t)
	now := time.Now().UTC()
	var writes []jobstore.Write
	for _, id := range []string{"job-gone", "job-kept"} {
		j := jobstore.NewJob(id, spec.Job{Name: id, Steps: []spec.Step{{ID: "a", Action: "echo"}}}, now)
		j.State, j.FinishedAt = jobstore.JobSucceeded, now
		if _, err := st.CreateJob(ctx, j); err != nil { // the stream is not empty
			t.Fatal(err)
		}
		writes = append(writes, st.JobWrite(j, 0))
	}
	seq := uint64(1)
	msg := func(id string, h nats.Header, pending uint64) jetstream.Msg {
		defer func() { seq++ }()
		return &scriptedMsg{subject: "$KV." + protocol.BucketJobs + "." + protocol.JobKey(id), header: h,
			md: jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: seq}, NumPending: pending, Timestamp: now}}
	}
	marker := nats.Header{jetstream.MarkerReasonHeader: []string{"MaxAge"}}
	js2 := &scriptedJS{JetStream: js, msgs: []jetstream.Msg{
		msg("job-gone", writes[0].Msg.Header, 2),
		msg("job-kept", writes[1].Msg.Header, 1),
		msg("job-gone", marker, 0), // its retention ended during the scan
	}}

	got, err := st.ScanJobs(ctx, js2)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != "job-kept" {
		t.Fatalf("scan: %+v, want job-kept alone", got)
	}
	page, err := st.List(ctx, js2, jobstore.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if page.Matched != 1 || page.Counts[jobstore.JobSucceeded] != 1 || len(page.Jobs) != 1 || page.Jobs[0].ID != "job-kept" {
		t.Fatalf("page: matched %d, counts %v, %d jobs, want job-kept alone", page.Matched, page.Counts, len(page.Jobs))
	}
}

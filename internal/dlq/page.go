package dlq

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// MaxPage is the most dead letters one Page returns.
const MaxPage = 1000

// maxSummaryText bounds a summary's detail and last error, in bytes.
const maxSummaryText = 512

// Summary is a dead letter without its task: what a listing shows. A
// letter is a copy of a task and may be as large as a NATS message; its
// headers and payload come with the Letter itself (Get; GET
// /queues/dead-letters/{id}).
type Summary struct {
	ID      uint64    `json:"id"`
	Subject string    `json:"subject"`
	Time    time.Time `json:"time"`
	// Parked, its detail and last error cut to 512 bytes (… marks a cut).
	Parked
	// Size is the stored payload's size in bytes.
	Size int `json:"size"`
}

// Page lists up to limit dead letters (0, or more than MaxPage: MaxPage)
// whose id is above after, oldest first, as summaries. A page shorter than
// limit is the last; the next page starts after the last id of this one.
//
// It reads headers only, through a consumer it deletes after: a page costs
// its summaries, not its letters' payloads.
func (q *Queue) Page(ctx context.Context, after uint64, limit int) ([]Summary, error) {
	out := []Summary{}
	if limit <= 0 || limit > MaxPage {
		limit = MaxPage
	}
	if after == math.MaxUint64 {
		return out, nil
	}
	// The stream's state now (q.stream's cached info is from Open).
	s := q.stream
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", protocol.StreamDLQ, err)
	}
	if st := info.State; st.Msgs == 0 || st.LastSeq <= after {
		return out, nil
	}
	cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: after + 1,
		FilterSubject: protocol.SubjectDLQPrefix + ".>",
		AckPolicy:     jetstream.AckNonePolicy, HeadersOnly: true,
		Replicas: 1, MemoryStorage: true,
		// Deleted below; this removes it if the delete is lost.
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("read dead letters: %w", err)
	}
	defer streams.DropConsumer(ctx, q.js, protocol.StreamDLQ, cons)
	batch, err := cons.FetchNoWait(limit)
	if err != nil {
		return nil, fmt.Errorf("read dead letters: %w", err)
	}
	for m := range batch.Messages() {
		out = append(out, summary(m))
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		return nil, fmt.Errorf("read dead letters: %w", err)
	}
	return out, nil
}

// summary reads a letter delivered headers only.
func summary(m jetstream.Msg) Summary {
	h := m.Headers()
	l := Summary{Subject: m.Subject(), Parked: parked(h)}
	l.Detail, l.LastError = jobstore.Clip(l.Detail, maxSummaryText), jobstore.Clip(l.LastError, maxSummaryText)
	if md, err := m.Metadata(); err == nil {
		l.ID, l.Time = md.Sequence.Stream, md.Timestamp
	}
	l.Size, _ = strconv.Atoi(h.Get(nats.MsgSize))
	return l
}

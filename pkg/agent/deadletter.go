package agent

import (
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// deadLetter copies a task message to warden.dlq.<pool>.<agent> with the
// Warden-DLQ-* headers, then terminates it. The copy comes first because a
// terminated work-queue message is gone and the supervisor, which sees the
// termination advisory, relies on the copy. If the copy is not stored the
// message is left alone: it comes back after the lease and we try again.
func (a *Agent) deadLetter(msg jetstream.Msg, reason protocol.DLQReason, detail string) {
	m := nats.NewMsg(protocol.DLQSubject(a.cfg.Pool, a.cfg.ID))
	for k, v := range msg.Headers() {
		if k != protocol.HeaderMsgID {
			m.Header[k] = append([]string(nil), v...)
		}
	}
	m.Data = msg.Data()
	var stream string
	var seq, deliveries uint64
	if md, err := msg.Metadata(); err == nil {
		stream, seq, deliveries = md.Stream, md.Sequence.Stream, md.NumDelivered
	}
	h := msg.Headers()
	id := "dlq." + stream + "." + strconv.FormatUint(seq, 10) + "." + string(reason)
	if job, step, epoch := h.Get(protocol.HeaderJob), h.Get(protocol.HeaderStep), h.Get(protocol.HeaderEpoch); job != "" && step != "" && epoch != "" {
		id = "dlq." + job + "." + step + "." + epoch + "." + string(reason) // the supervisor's form
	}
	m.Header.Set(protocol.HeaderMsgID, id)
	m.Header.Set(protocol.HeaderDLQReason, string(reason))
	m.Header.Set(protocol.HeaderDLQDetail, detail)
	m.Header.Set(protocol.HeaderDLQDeliveries, strconv.FormatUint(deliveries, 10))
	m.Header.Set(protocol.HeaderDLQStream, stream)
	m.Header.Set(protocol.HeaderDLQStreamSeq, strconv.FormatUint(seq, 10))
	m.Header.Set(protocol.HeaderDLQTime, a.now().UTC().Format(time.RFC3339Nano))

	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if _, err := a.js.PublishMsg(ctx, m); err != nil {
		a.log.Warn().Err(err).Str("reason", string(reason)).Msg("dead-letter copy failed; the task comes back after the lease")
		return
	}
	a.term(msg, "warden: "+string(reason)+": "+detail)
}

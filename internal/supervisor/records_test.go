package supervisor

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/protocol"
)

// A delete, a purge and the server's marker for a record removed by its
// TTL or a purge all take the key out of the index from the headers alone
// (the follower has no bucket here: a read would panic).
func TestFollowerReadsRemovalsFromHeaders(t *testing.T) {
	t.Parallel()
	f := &follower{log: zerolog.Nop()}
	t0 := time.Unix(10_000, 0)
	for _, h := range []nats.Header{
		{"KV-Operation": {"DEL"}},
		{"KV-Operation": {"PURGE"}},
		{jetstream.MarkerReasonHeader: {"MaxAge"}},
		{jetstream.MarkerReasonHeader: {"Purge"}},
		{jetstream.MarkerReasonHeader: {"Remove"}},
	} {
		r, ok := f.record(context.Background(), "job.j", h, t0)
		if !ok || !r.Deleted {
			t.Errorf("headers %v: record %+v, ok %v; want deleted", h, r, ok)
		}
	}
	r, ok := f.record(context.Background(), "step.j.s", nats.Header{
		protocol.HeaderRecordState:       {"dispatched"},
		protocol.HeaderRecordLockedUntil: {t0.Add(time.Minute).Format(time.RFC3339Nano)},
	}, t0)
	if !ok || r.Deleted || r.State != "dispatched" || !r.LockedUntil.Equal(t0.Add(time.Minute)) {
		t.Errorf("dispatched step: record %+v, ok %v", r, ok)
	}
}

package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
)

// A multi-step job accepted an hour before the feed started (or a finished
// job reopened by a retry) has its job record rewritten without a lease,
// then a step dispatched: the feed took the rewrite for an acceptance and
// observed the job's whole age (3600 s) as a queue latency. Only the
// write that accepted a job starts its wait now. (Found by a reviewer.)
//
// Old code: "queue latency: 2 samples, sum 3600 s: a job accepted an hour
// before the feed was observed".
func TestQueueLatencyCountsOnlyAcceptances(t *testing.T) {
	t.Parallel()
	b := setupFeed(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lease := time.Now().Add(time.Minute)
	old := time.Now().Add(-time.Hour)
	writeRecord(ctx, t, b.js, protocol.JobKey("old"), "running", old, time.Time{}) // e.g. a step result rewrote it
	writeRecord(ctx, t, b.js, protocol.StepKey("old", "s2"), "dispatched", time.Time{}, lease)
	writeRecord(ctx, t, b.js, protocol.JobKey("new"), "running", time.Now(), lease) // a marker: read up to here
	natstest.Eventually(t, 10*time.Second, "the marker job observed", func() bool {
		return b.histogramCount(t, "warden_queue_latency_seconds") >= 1
	})
	m := b.metric(t, "warden_queue_latency_seconds", nil).GetHistogram()
	if m.GetSampleCount() != 1 || m.GetSampleSum() > 60 {
		t.Fatalf("queue latency: %d samples, sum %.0f s: a job accepted an hour before the feed was observed", m.GetSampleCount(), m.GetSampleSum())
	}
}

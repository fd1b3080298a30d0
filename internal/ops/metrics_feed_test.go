package ops_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// feedBundle is a running Feed over an embedded server.
type feedBundle struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	reg *prometheus.Registry
}

// setupFeed starts a server; before runs before the feed starts (to store
// what the feed must not count), then the feed runs until the test ends,
// and setupFeed returns once both its consumers exist.
func setupFeed(t *testing.T, before func(ctx context.Context, js jetstream.JetStream)) *feedBundle {
	t.Helper()
	_, nc, js := natstest.Start(t, streams.Options{TaskShards: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before(ctx, js)
	}
	b := &feedBundle{nc: nc, js: js, reg: prometheus.NewRegistry()}
	feed := ops.NewFeed(ops.New(nc, store), b.reg, zerolog.Nop())
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- feed.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("feed: %v", err)
		}
	})
	for _, stream := range []string{"KV_" + protocol.BucketJobs, protocol.StreamEvents} {
		natstest.Eventually(t, 10*time.Second, "the feed's consumer on "+stream, func() bool {
			s, err := js.Stream(ctx, stream)
			if err != nil {
				return false
			}
			info, err := s.Info(ctx)
			return err == nil && info.State.Consumers >= 1
		})
	}
	return b
}

// metric returns the sample of name whose labels include want, or nil.
func (b *feedBundle) metric(t *testing.T, name string, want map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue next
				}
			}
			return m
		}
	}
	return nil
}

func (b *feedBundle) histogramCount(t *testing.T, name string) uint64 {
	t.Helper()
	if m := b.metric(t, name, nil); m != nil {
		return m.GetHistogram().GetSampleCount()
	}
	return 0
}

func (b *feedBundle) counter(t *testing.T, name, label, value string) float64 {
	t.Helper()
	if m := b.metric(t, name, map[string]string{label: value}); m != nil {
		return m.GetCounter().GetValue()
	}
	return 0
}

// writeRecord stores a job-store record with the headers the feed reads
// (as jobstore.JobWrite and StepWrite set them).
func writeRecord(ctx context.Context, t *testing.T, js jetstream.JetStream, key, state string, created, lockedUntil time.Time) {
	t.Helper()
	m := nats.NewMsg("$KV." + protocol.BucketJobs + "." + key)
	m.Header.Set(protocol.HeaderRecordState, state)
	if !created.IsZero() {
		m.Header.Set(protocol.HeaderRecordCreated, created.UTC().Format(time.RFC3339Nano))
	}
	if !lockedUntil.IsZero() {
		m.Header.Set(protocol.HeaderRecordLockedUntil, lockedUntil.UTC().Format(time.RFC3339Nano))
	}
	m.Data = []byte("{}")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
}

func publishEvent(ctx context.Context, t *testing.T, js jetstream.JetStream, subjectKind protocol.EventKind, ev protocol.Event) {
	t.Helper()
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	m := nats.NewMsg(protocol.EventSubject(subjectKind, ev.ID))
	m.Data, _ = json.Marshal(ev)
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
}

// A job whose first step is dispatched in the turn that accepts it has a
// first job record that already carries the lease. Such jobs (single-step
// jobs, mostly) were never observed in warden_queue_latency_seconds: only
// a job first written without a lease was. The later dispatch of another
// step of a job observed is not observed again, and a job accepted before
// the feed started is not observed at all.
func TestQueueLatencyObservesJobsDispatchedWhenAccepted(t *testing.T) {
	t.Parallel()
	b := setupFeed(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lease := time.Now().Add(time.Minute)
	for i := range 5 {
		job := fmt.Sprintf("single%d", i)
		writeRecord(ctx, t, b.js, protocol.JobKey(job), "running", time.Now(), lease)
		// A later step of the same job dispatched: not a first dispatch.
		writeRecord(ctx, t, b.js, protocol.JobKey(job), "running", time.Now(), lease)
	}
	// Accepted before the feed started: its age is not a queue latency.
	writeRecord(ctx, t, b.js, protocol.JobKey("old"), "running", time.Now().Add(-time.Hour), lease)
	// A two-step job: accepted pending, its first step dispatched on its
	// own record (counted before too).
	twoStep := func(job string) {
		writeRecord(ctx, t, b.js, protocol.JobKey(job), "running", time.Now(), time.Time{})
		writeRecord(ctx, t, b.js, protocol.StepKey(job, "s1"), "dispatched", time.Time{}, lease)
	}
	twoStep("two")
	natstest.Eventually(t, 10*time.Second, "5 single-step jobs and a two-step one observed", func() bool {
		return b.histogramCount(t, "warden_queue_latency_seconds") >= 6
	})
	// Once a job written after all the above is counted, they have all
	// been read: none was counted twice.
	twoStep("last")
	natstest.Eventually(t, 10*time.Second, "the last job observed", func() bool {
		return b.histogramCount(t, "warden_queue_latency_seconds") >= 7
	})
	if n := b.histogramCount(t, "warden_queue_latency_seconds"); n != 7 {
		t.Fatalf("warden_queue_latency_seconds count = %d, want 7", n)
	}
}

// The events stored before the feed started are not counted: each start
// of the API counted WARDEN_EVENTS' whole history again, so its counters
// fell after a restart once old events aged out, or jumped.
func TestEventsFeedCountsFromItsStart(t *testing.T) {
	t.Parallel()
	b := setupFeed(t, func(ctx context.Context, js jetstream.JetStream) {
		publishEvent(ctx, t, js, protocol.EventHealing, protocol.Event{Kind: protocol.EventHealing, ID: "before", Data: map[string]string{"action": "drain"}})
		publishEvent(ctx, t, js, protocol.EventStepRecovered, protocol.Event{Kind: protocol.EventStepRecovered, ID: "before", Data: map[string]string{"status": "lease_expired"}})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	publishEvent(ctx, t, b.js, protocol.EventHealing, protocol.Event{Kind: protocol.EventHealing, ID: "after", Data: map[string]string{"action": "drain"}})
	publishEvent(ctx, t, b.js, protocol.EventFailover, protocol.Event{Kind: protocol.EventFailover, ID: "after", Data: map[string]string{"duration": "2s"}})
	natstest.Eventually(t, 10*time.Second, "the failover published last counted", func() bool {
		return b.histogramCount(t, "warden_failover_duration_seconds") >= 1
	})
	if n := b.counter(t, "warden_healing_actions_total", "type", "drain"); n != 1 {
		t.Errorf("warden_healing_actions_total{type=drain} = %g, want 1 (the event stored before the start not counted)", n)
	}
	if n := b.counter(t, "warden_retries_total", "reason", "lease_expired"); n != 0 {
		t.Errorf("warden_retries_total{reason=lease_expired} = %g, want 0", n)
	}
}

// The feed takes an event's kind from its subject, which publish
// permissions are checked against: a cluster member may publish
// warden.event.healing.*, and a body there claiming kind failover or
// step_recovered used to be counted as one. Label values the code never
// publishes are counted as "other", not as new series.
func TestEventsFeedTrustsTheSubjectAndBoundsLabels(t *testing.T) {
	t.Parallel()
	b := setupFeed(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Forged on the healing subject a cluster member may publish on.
	publishEvent(ctx, t, b.js, protocol.EventHealing, protocol.Event{Kind: protocol.EventFailover, ID: "f1", Data: map[string]string{"duration": "1h"}})
	publishEvent(ctx, t, b.js, protocol.EventHealing, protocol.Event{Kind: protocol.EventStepRecovered, ID: "f2", Data: map[string]string{"status": "lease_expired"}})
	publishEvent(ctx, t, b.js, protocol.EventHealing, protocol.Event{Kind: protocol.EventHealing, ID: "f3", Data: map[string]string{"action": "made-up-1"}})
	publishEvent(ctx, t, b.js, protocol.EventHealing, protocol.Event{Kind: protocol.EventHealing, ID: "f4", Data: map[string]string{"action": "request_agents"}})
	publishEvent(ctx, t, b.js, protocol.EventStepRecovered, protocol.Event{Kind: protocol.EventStepRecovered, ID: "r1", Data: map[string]string{"status": "made-up-2"}})
	// Published last: once counted, the events above have been read.
	publishEvent(ctx, t, b.js, protocol.EventStepRecovered, protocol.Event{Kind: protocol.EventStepRecovered, ID: "r2", Data: map[string]string{"status": "transferred"}})
	natstest.Eventually(t, 10*time.Second, "the last step_recovered counted", func() bool {
		return b.counter(t, "warden_retries_total", "reason", "transferred") >= 1
	})
	if n := b.histogramCount(t, "warden_failover_duration_seconds"); n != 0 {
		t.Errorf("warden_failover_duration_seconds count = %d, want 0 (a healing subject's body claiming failover)", n)
	}
	if n := b.counter(t, "warden_retries_total", "reason", "lease_expired"); n != 0 {
		t.Errorf("warden_retries_total{reason=lease_expired} = %g, want 0 (a healing subject's body claiming step_recovered)", n)
	}
	for _, bad := range []struct{ name, label, value string }{
		{"warden_healing_actions_total", "type", "made-up-1"},
		{"warden_retries_total", "reason", "made-up-2"},
	} {
		if b.metric(t, bad.name, map[string]string{bad.label: bad.value}) != nil {
			t.Errorf("%s{%s=%q} exists: a label value the code never publishes", bad.name, bad.label, bad.value)
		}
	}
	if n := b.counter(t, "warden_healing_actions_total", "type", "other"); n != 1 {
		t.Errorf("warden_healing_actions_total{type=other} = %g, want 1", n)
	}
	if n := b.counter(t, "warden_healing_actions_total", "type", "request_agents"); n != 1 {
		t.Errorf("warden_healing_actions_total{type=request_agents} = %g, want 1", n)
	}
	if n := b.counter(t, "warden_retries_total", "reason", "other"); n != 1 {
		t.Errorf("warden_retries_total{reason=other} = %g, want 1", n)
	}
}

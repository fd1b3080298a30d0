package security

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/creds"
	"github.com/wardenhq/warden/internal/natsconn"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

const pool = "default"

// TestAgentCannotActForAnother: agent a1's credential refuses everything
// that touches agent a2 or anything but a1's own work.
func TestAgentCannotActForAnother(t *testing.T) {
	d := start(t, pool+".a1", pool+".a2")
	d.setupStreams(t)
	a1 := d.connect(t, creds.AgentIdentity(pool, "a1"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// What a1 may do: its own consumer, presence key, result.
	s1 := protocol.Shard(pool, "a1", shards)
	stream1, err := a1.js.Stream(ctx, protocol.TaskStream(s1))
	if err != nil {
		t.Fatalf("a1 binds its task stream: %v", err)
	}
	cc, _ := streams.TaskConsumer(s1, pool, "a1", 0, 0, 0)
	if _, err := stream1.CreateOrUpdateConsumer(ctx, cc); err != nil {
		t.Fatalf("a1 creates its consumer: %v", err)
	}
	kv, err := a1.js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		t.Fatalf("a1 binds presence: %v", err)
	}
	if _, err := kv.Put(ctx, protocol.PresenceKey(pool, "a1"), []byte(`{}`)); err != nil {
		t.Fatalf("a1 writes its presence: %v", err)
	}
	if _, err := a1.js.Publish(ctx, protocol.ResultSubject(pool, "a1", "j1", "s1"), []byte(`{}`)); err != nil {
		t.Fatalf("a1 reports its result: %v", err)
	}
	if got := a1.refusals(); len(got) != 0 {
		t.Fatalf("a1's own work refused: %v", got)
	}

	s2 := protocol.Shard(pool, "a2", shards)
	stream2 := protocol.TaskStream(s2)

	t.Run("pull another agent's tasks", func(t *testing.T) {
		subj := "$JS.API.CONSUMER.MSG.NEXT." + stream2 + ".a2"
		_, err := a1.nc.Request(subj, []byte(`{"batch":1}`), 300*time.Millisecond)
		if err == nil {
			t.Fatal("pull answered")
		}
		a1.expectRefused(t, "publish", subj)
	})
	t.Run("create a consumer on another agent's subject", func(t *testing.T) {
		rctx, cancel := shortCtx()
		defer cancel()
		cfg := jetstream.ConsumerConfig{Durable: "a1", FilterSubject: protocol.TaskSubject(s2, pool, "a2"), AckPolicy: jetstream.AckExplicitPolicy}
		if _, err := a1.js.CreateOrUpdateConsumer(rctx, stream2, cfg); err == nil {
			t.Fatal("consumer created")
		}
		a1.expectRefused(t, "publish", "$JS.API.CONSUMER.CREATE."+stream2+".a1."+protocol.TaskSubject(s2, pool, "a2"))
		cfg.Durable = "a2"
		rctx2, cancel2 := shortCtx()
		defer cancel2()
		if _, err := a1.js.CreateOrUpdateConsumer(rctx2, stream2, cfg); err == nil {
			t.Fatal("consumer created")
		}
		a1.expectRefused(t, "publish", "$JS.API.CONSUMER.CREATE."+stream2+".a2."+protocol.TaskSubject(s2, pool, "a2"))
	})
	t.Run("delete another agent's consumer", func(t *testing.T) {
		rctx, cancel := shortCtx()
		defer cancel()
		if err := a1.js.DeleteConsumer(rctx, stream2, "a2"); err == nil {
			t.Fatal("consumer deleted")
		}
		a1.expectRefused(t, "publish", "$JS.API.CONSUMER.DELETE."+stream2+".a2")
	})
	t.Run("write another agent's presence", func(t *testing.T) {
		rctx, cancel := shortCtx()
		defer cancel()
		if _, err := kv.Put(rctx, protocol.PresenceKey(pool, "a2"), []byte(`{}`)); err == nil {
			t.Fatal("presence written")
		}
		a1.expectRefused(t, "publish", "$KV.warden_presence.default.a2")
	})
	t.Run("publish a result naming another agent", func(t *testing.T) {
		rctx, cancel := shortCtx()
		defer cancel()
		subj := protocol.ResultSubject(pool, "a2", "j1", "s1")
		if _, err := a1.js.Publish(rctx, subj, []byte(`{}`)); err == nil {
			t.Fatal("result accepted")
		}
		a1.expectRefused(t, "publish", subj)
	})
	t.Run("read another inbox", func(t *testing.T) {
		for _, subj := range []string{"_INBOX.>", "_INBOX.scheduler.>", creds.InboxPrefix(creds.AgentIdentity(pool, "a2")) + ".>"} {
			if _, err := a1.nc.SubscribeSync(subj); err != nil {
				t.Fatal(err)
			}
			a1.expectRefused(t, "subscribe", subj)
		}
	})
	t.Run("submit a job", func(t *testing.T) {
		rctx, cancel := shortCtx()
		defer cancel()
		if _, err := a1.js.Publish(rctx, protocol.SubmitSubject("j9"), []byte(`{}`)); err == nil {
			t.Fatal("submission accepted")
		}
		a1.expectRefused(t, "publish", protocol.SubmitSubject("j9"))
	})
	t.Run("forge an advisory", func(t *testing.T) {
		subj := "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + protocol.TaskStream(s1) + ".a1"
		if err := a1.nc.Publish(subj, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		a1.expectRefused(t, "publish", subj)
	})
	t.Run("delete a stream", func(t *testing.T) {
		rctx, cancel := shortCtx()
		defer cancel()
		if err := a1.js.DeleteStream(rctx, protocol.StreamEvents); err == nil {
			t.Fatal("stream deleted")
		}
		a1.expectRefused(t, "publish", "$JS.API.STREAM.DELETE."+protocol.StreamEvents)
	})
}

// TestPublisherCanOnlySubmit: the publisher's credential submits and does
// nothing else.
func TestPublisherCanOnlySubmit(t *testing.T) {
	d := start(t)
	d.setupStreams(t)
	p := d.connect(t, creds.RolePublisher)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.js.Publish(ctx, protocol.SubmitSubject("job-1"), []byte(`{"steps":[]}`)); err != nil {
		t.Fatalf("submit: %v", err)
	}
	if _, err := p.js.Publish(ctx, protocol.SubjectSubmit, []byte(`{"steps":[]}`)); err != nil {
		t.Fatalf("bare submit: %v", err)
	}
	if got := p.refusals(); len(got) != 0 {
		t.Fatalf("submissions refused: %v", got)
	}
	// A roll-up would have the server purge every queued submission (all)
	// or another job's (sub) as it stores this one: WARDEN_SUBMIT refuses
	// roll-ups since delayed submissions moved to WARDEN_DELAY, which only
	// schedulers write.
	for _, rollup := range []string{"all", "sub"} {
		m := nats.NewMsg(protocol.SubmitSubject("job-1"))
		m.Data = []byte(`{"steps":[]}`)
		m.Header.Set("Nats-Rollup", rollup)
		if _, err := p.js.PublishMsg(ctx, m); err == nil || !strings.Contains(err.Error(), "rollup not permitted") {
			t.Fatalf("a submission with Nats-Rollup: %s: %v, want the server's refusal", rollup, err)
		}
	}
	if st, err := d.connect(t, creds.RoleAdmin).js.Stream(ctx, protocol.StreamSubmit); err != nil {
		t.Fatal(err)
	} else if info, err := st.Info(ctx, jetstream.WithSubjectFilter(protocol.SubjectSubmit+".>")); err != nil || info.State.Msgs < 2 {
		t.Fatalf("queued submissions after the refused roll-ups: %+v %v, want both", info, err)
	}
	for _, subj := range []string{
		"$JS.API.STREAM.INFO.KV_warden_jobs",
		protocol.DelaySubject("job-1"),
		protocol.DelayedSubject("job-1"),
		"$KV.warden_jobs.job.job-1",
		protocol.TaskSubject(0, pool, "a1"),
		protocol.ResultSubject(pool, "a1", "job-1", "s"),
		protocol.EventSubject("job_submitted", "job-1"),
		protocol.AgentControlSubject(pool, "a1"),
		protocol.SubjectControlAdvance,
		"$JS.API.STREAM.PURGE." + protocol.StreamSubmit,
	} {
		if err := p.nc.Publish(subj, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		p.expectRefused(t, "publish", subj)
	}
	if _, err := p.nc.SubscribeSync("warden.>"); err != nil {
		t.Fatal(err)
	}
	p.expectRefused(t, "subscribe", "warden.>")
}

// TestReadonlyCannotChangeAnything: the read-only CLI credential reads the
// job store, presence, health, events and dead letters, and changes none.
func TestReadonlyCannotChangeAnything(t *testing.T) {
	d := start(t)
	d.setupStreams(t)
	r := d.connect(t, creds.RoleReadonly)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, b := range []string{protocol.BucketJobs, protocol.BucketPresence, protocol.BucketHealth} {
		kv, err := r.js.KeyValue(ctx, b)
		if err != nil {
			t.Fatalf("bind %s: %v", b, err)
		}
		w, err := kv.WatchAll(ctx)
		if err != nil {
			t.Fatalf("watch %s: %v", b, err)
		}
		<-w.Updates()
		_ = w.Stop()
		if _, err := kv.Get(ctx, "job.x"); err != nil && err != jetstream.ErrKeyNotFound {
			t.Fatalf("get %s: %v", b, err)
		}
	}
	for _, s := range []string{protocol.StreamDLQ, protocol.StreamEvents} {
		st, err := r.js.Stream(ctx, s)
		if err != nil {
			t.Fatalf("bind %s: %v", s, err)
		}
		if _, err := st.GetMsg(ctx, 1); err != nil && err != jetstream.ErrMsgNotFound {
			t.Fatalf("read %s: %v", s, err)
		}
	}
	if got := r.refusals(); len(got) != 0 {
		t.Fatalf("reads refused: %v", got)
	}
	for _, subj := range []string{
		"$KV.warden_jobs.job.x",
		// Discovery: answered on any reply subject, with the answering
		// process's permissions.
		"$SRV.PING", "$SRV.INFO.warden-scheduler",
		"$KV.warden_presence.default.a1",
		"$KV.warden_health.default.a1",
		protocol.SubmitSubject("x"),
		protocol.AgentControlSubject(pool, "a1"),
		protocol.SubjectControlFailover,
		protocol.SubjectControlAdvance,
		"$JS.API.STREAM.PURGE." + protocol.StreamDLQ,
		"$JS.API.STREAM.MSG.DELETE." + protocol.StreamDLQ,
		"$JS.API.STREAM.DELETE." + protocol.StreamEvents,
		"$JS.API.STREAM.UPDATE." + protocol.StreamEvents,
		protocol.EventSubject("healing", "x"),
		"warden.ops.api.admin.jobs.cancel",
		"warden.ops.scheduler.admin.jobs.retry",
		// The schedulers' shared tick consumer: pulled, acked, re-filtered
		// or deleted, no recurring job would be submitted.
		"$JS.API.CONSUMER.MSG.NEXT." + streams.StreamSchedules + ".schedule-relay",
		"$JS.API.CONSUMER.CREATE." + streams.StreamSchedules + ".schedule-relay",
		"$JS.API.CONSUMER.DELETE." + streams.StreamSchedules + ".schedule-relay",
	} {
		if err := r.nc.Publish(subj, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		r.expectRefused(t, "publish", subj)
	}
}

// TestNoRoleMayForgeAdvisoriesOrChangeStreams: only setup creates, updates
// or deletes streams; nobody publishes on $JS.EVENT.>.
func TestNoRoleMayForgeAdvisoriesOrChangeStreams(t *testing.T) {
	d := start(t, pool+".a1")
	d.setupStreams(t)
	ids := append([]string{}, creds.FixedRoles...)
	ids = append(ids, creds.AgentIdentity(pool, "a1"))
	for _, id := range ids {
		c := d.connect(t, id)
		subj := "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.WARDEN_TASKS_0.a1"
		if err := c.nc.Publish(subj, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		c.expectRefused(t, "publish", subj)
		if id == creds.RoleSetup {
			continue
		}
		for _, op := range []string{"DELETE", "UPDATE", "CREATE", "PURGE"} {
			subj := "$JS.API.STREAM." + op + "." + protocol.StreamEvents
			if op == "PURGE" {
				subj = "$JS.API.STREAM.PURGE." + protocol.StreamResults
			}
			if err := c.nc.Publish(subj, []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			c.expectRefused(t, "publish", subj)
		}
	}
}

// TestEnsureWithoutSetupRights: a scheduler's Ensure changes nothing when
// the streams match (no refusal), and reports a SetupError naming the
// stream, with the refusal, when they do not.
func TestEnsureWithoutSetupRights(t *testing.T) {
	d := start(t)
	d.setupStreams(t)
	d.log.reset()
	s := d.connect(t, creds.RoleScheduler)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, s.js, streams.Options{TaskShards: shards}); err != nil {
		t.Fatalf("scheduler's Ensure on streams made by setup: %v", err)
	}
	d.log.none(t, "Ensure on matching streams")

	// A process configured with another lease TTL needs a bucket setup
	// did not make: refused, reported as a setup problem and a refusal.
	since := time.Now()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	err := streams.Ensure(ctx2, s.js, streams.Options{TaskShards: shards, LeaseTTL: 7 * time.Second})
	var se *streams.SetupError
	if !asSetup(err, &se) || se.Name != "KV_"+protocol.BucketLeases {
		t.Fatalf("Ensure with a changed bucket: %v, want a SetupError for KV_%s", err, protocol.BucketLeases)
	}
	s.expectRefused(t, "publish", "$JS.API.STREAM.UPDATE.KV_"+protocol.BucketLeases)
	var pe *natsconn.PermissionError
	if !asPerm(natsconn.Explain(s.nc, since, err), &pe) {
		t.Fatalf("Explain(%v) is not a PermissionError", err)
	}
}

// TestAPIReachesOnlyWhatItsRoutesNeed: the HTTP API's identity may not
// send discovery requests (answered on any reply subject with the
// answering process's permissions: a ping whose reply subject was the
// deployment record's key overwrote it through the scheduler), call the
// other processes' ops endpoints, or write schedules (it has no schedule
// route).
func TestAPIReachesOnlyWhatItsRoutesNeed(t *testing.T) {
	d := start(t)
	d.setupStreams(t)
	a := d.connect(t, creds.RoleAPI)
	for _, subj := range []string{
		"$SRV.PING", "$SRV.PING.warden-scheduler", "$SRV.INFO.warden-supervisor",
		"warden.ops.scheduler.jobs.list", "warden.ops.scheduler.admin.jobs.retry",
		protocol.ScheduleDefSubject("x"), protocol.ScheduleTimerSubject("x"),
		"$JS.API.STREAM.PURGE." + streams.StreamSchedules,
		protocol.SubjectControlGateFreed,
	} {
		if err := a.nc.Publish(subj, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		a.expectRefused(t, "publish", subj)
	}
}

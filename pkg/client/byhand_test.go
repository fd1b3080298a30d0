package client_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
)

// TestDriveAStepByHand performs, with raw NATS operations, exactly what the
// worked example of docs/protocol.md does with the nats CLI against a real
// scheduler: presence by KV put, a task consumer, a raw pull, +WPI as a
// request, the result published and acknowledged by the server, then +ACK.
// If this test changes, the document must change with it.
func TestDriveAStepByHand(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	nc, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// bin/scheduler: it creates the streams and buckets (4 task shards).
	sched, err := scheduler.New(scheduler.DefaultConfig(), nc, scheduler.WithLogger(zerolog.Nop()))
	if err != nil {
		t.Fatal(err)
	}
	schedDone := make(chan error, 1)
	sctx, stopSched := context.WithCancel(ctx)
	go func() { schedDone <- sched.Run(sctx) }()
	defer func() { stopSched(); <-schedDone }()
	natstest.Eventually(t, 10*time.Second, "streams and buckets created", func() bool {
		_, err := js.KeyValue(ctx, protocol.BucketLeases) // the last one Ensure creates
		return err == nil
	})

	// Step 1: the shard of manual.hand-2 with 4 shards.
	if s := protocol.Shard("manual", "hand-2", 4); s != 1 {
		t.Fatalf("shard %d; the document says 1", s)
	}

	// Step 2: presence, put every second (nats kv put warden_presence manual.hand-2 ...).
	kv, err := js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	hctx, stopHeartbeat := context.WithCancel(ctx)
	heartbeatDone := make(chan struct{})
	go func() {
		defer close(heartbeatDone)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			body := `{"id":"hand-2","pool":"manual","actions":["echo"],"max_concurrent":1,"in_flight":0,` +
				`"version":"by-hand","task_stream":"WARDEN_TASKS_1","task_subject":"warden.task.1.manual.hand-2",` +
				`"heartbeat_at":"` + time.Now().UTC().Format(time.RFC3339) + `"}`
			if _, err := kv.Put(hctx, "manual.hand-2", []byte(body)); err != nil && hctx.Err() == nil {
				t.Errorf("presence put: %v", err)
			}
			select {
			case <-hctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { stopHeartbeat(); <-heartbeatDone }()

	// Step 3: nats consumer add WARDEN_TASKS_1 hand-2 --pull --filter warden.task.1.manual.hand-2
	//   --ack explicit --deliver all --max-deliver 5 --max-pending 1 --wait 60s --replay instant --defaults
	_, err = js.CreateOrUpdateConsumer(ctx, "WARDEN_TASKS_1", jetstream.ConsumerConfig{
		Durable: "hand-2", FilterSubject: "warden.task.1.manual.hand-2", AckPolicy: jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy, MaxDeliver: 5, MaxAckPending: 1, AckWait: 60 * time.Second,
		ReplayPolicy: jetstream.ReplayInstantPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}

	// Step 4: bin/warden submit -f hello.yaml
	c := client.New(js, client.Options{})
	if err := c.WaitForAgents(ctx, "manual", 1); err != nil {
		t.Fatal(err)
	}
	hello := "name: hello-by-hand\nsteps:\n  - id: hello\n    action: echo\n    pool: manual\n    timeout: 2m\n    params: {message: hi}\n"
	r, err := c.Submit(ctx, []byte(hello), client.SubmitOptions{})
	if err != nil || !r.Confirmed {
		t.Fatalf("submit: %+v %v", r, err)
	}

	// Step 5: nats sub _INBOX.hand-2 in one terminal, and in another
	// nats pub '$JS.API.CONSUMER.MSG.NEXT.WARDEN_TASKS_1.hand-2' '{"batch":1,"expires":60000000000}' --reply _INBOX.hand-2
	inbox, err := nc.SubscribeSync("_INBOX.hand-2")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.WARDEN_TASKS_1.hand-2", "_INBOX.hand-2",
		[]byte(`{"batch":1,"expires":60000000000}`)); err != nil {
		t.Fatal(err)
	}
	task, err := inbox.NextMsgWithContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if task.Subject != "warden.task.1.manual.hand-2" || !strings.HasPrefix(task.Reply, "$JS.ACK.WARDEN_TASKS_1.hand-2.1.") {
		t.Fatalf("task on %q with reply %q", task.Subject, task.Reply)
	}
	h := task.Header
	if h.Get(protocol.HeaderJob) != r.JobID || h.Get(protocol.HeaderStep) != "hello" || h.Get(protocol.HeaderEpoch) != "1" ||
		h.Get(protocol.HeaderAttempt) != "1" || h.Get(protocol.HeaderAction) != "echo" ||
		h.Get(protocol.HeaderMsgID) != r.JobID+".hello.1" || h.Get(protocol.HeaderDeadline) == "" {
		t.Fatalf("task headers %v", h)
	}
	var body protocol.Task
	if err := json.Unmarshal(task.Data, &body); err != nil || string(body.Params) != `{"message":"hi"}` {
		t.Fatalf("task body %s: %v", task.Data, err)
	}

	// The step record already names us, with the epoch and the lease.
	st, err := jobstore.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	step, _, err := st.Step(ctx, r.JobID, "hello")
	if err != nil || step.State != jobstore.StepDispatched || step.Actor != "hand-2" || step.Epoch != 1 {
		t.Fatalf("step before the result: %+v %v", step, err)
	}

	// Step 6: nats req '<reply>' '+WPI': the server's (empty) reply confirms the extension.
	if _, err := nc.RequestWithContext(ctx, task.Reply, []byte("+WPI")); err != nil {
		t.Fatalf("+WPI not confirmed: %v", err)
	}

	// Step 7: nats pub --jetstream warden.result.manual.hand-2.<job>.hello '<result>' -H ... : the PubAck says it is stored.
	res := nats.NewMsg("warden.result.manual.hand-2." + r.JobID + ".hello")
	res.Header.Set("Warden-Job", r.JobID)
	res.Header.Set("Warden-Step", "hello")
	res.Header.Set("Warden-Epoch", "1")
	res.Header.Set("Warden-Agent", "hand-2")
	res.Header.Set("Nats-Msg-Id", r.JobID+".hello.1."+h.Get("Warden-Token"))
	now := time.Now().UTC().Format(time.RFC3339)
	res.Data = []byte(`{"job_id":"` + r.JobID + `","step_id":"hello","epoch":1,"token":"` + h.Get("Warden-Token") + `","agent":"hand-2","pool":"manual","status":"succeeded",` +
		`"output":{"message":"hi"},"started_at":"` + now + `","finished_at":"` + now + `"}`)
	ack, err := js.PublishMsg(ctx, res)
	if err != nil || ack.Stream != protocol.StreamResults {
		t.Fatalf("result PubAck %+v %v", ack, err)
	}

	// Step 8: nats req '<reply>' '+ACK': only now is the task acknowledged.
	if _, err := nc.RequestWithContext(ctx, task.Reply, []byte("+ACK")); err != nil {
		t.Fatalf("+ACK not confirmed: %v", err)
	}

	// Step 9: nats kv get --raw warden_jobs job.<job> (a one-step job: its step is inline)
	job, err := c.Follow(ctx, r.JobID, nil)
	if err != nil || job.State != jobstore.JobSucceeded {
		t.Fatalf("job %+v %v", job, err)
	}
	step, _, err = st.Step(ctx, r.JobID, "hello")
	if err != nil || step.State != jobstore.StepSucceeded || step.Epoch != 1 || string(step.Output) != `{"message":"hi"}` {
		t.Fatalf("step after the result: %+v %v", step, err)
	}
}

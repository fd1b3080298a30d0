package scheduler_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/jobstore"
	"github.com/wardenhq/warden/pkg/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/scheduler"
	"github.com/wardenhq/warden/streams"
)

type bundle struct {
	srv   *natstest.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	store *jobstore.Store
}

func setup(t *testing.T) *bundle {
	t.Helper()
	srv := natstest.New(t)
	nc, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{})
	store, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{srv: srv, nc: nc, js: js, store: store}
}

// startScheduler runs a scheduler on its own connection until the test ends.
func (b *bundle) startScheduler(t *testing.T, cfg scheduler.Config) {
	t.Helper()
	nc, _ := b.srv.Connect(t)
	s, err := scheduler.New(cfg, nc, scheduler.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("scheduler: %v", err)
		}
	})
}

// submit publishes a spec with headers and returns the scheduler's reply.
func (b *bundle) submit(t *testing.T, body []byte, jobID, msgID string) protocol.SubmitReply {
	t.Helper()
	inbox := nats.NewInbox()
	sub, err := b.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	msg := nats.NewMsg(protocol.SubjectSubmit)
	msg.Data = body
	if jobID != "" {
		msg.Header.Set(protocol.HeaderJobID, jobID)
	}
	if msgID != "" {
		msg.Header.Set(protocol.HeaderMsgID, msgID)
	}
	msg.Header.Set(protocol.HeaderReplyTo, inbox)
	if _, err := b.js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no submission reply: %v", err)
	}
	var r protocol.SubmitReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func (b *bundle) waitJob(t *testing.T, id string, want jobstore.JobState) *jobstore.Job {
	t.Helper()
	var job *jobstore.Job
	natstest.Eventually(t, 20*time.Second, "job "+id+" "+string(want), func() bool {
		j, _, err := b.store.Job(context.Background(), id)
		if err != nil {
			return false
		}
		job = j
		return j.State == want
	})
	return job
}

// handAgent speaks the agent protocol by hand, as docs/protocol.md shows:
// it keeps a presence entry alive and answers its tasks.
type handAgent struct {
	id, pool string
	mu       sync.Mutex
	tasks    []protocol.Task
	// reply decides a task's result; nil means success echoing the params.
	reply func(protocol.Task) protocol.Result
}

func startHandAgent(t *testing.T, b *bundle, pool, id string, caps []string) *handAgent {
	t.Helper()
	a := &handAgent{id: id, pool: pool}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	shard := protocol.Shard(pool, id, streams.DefaultTaskShards)
	cfg, err := streams.TaskConsumer(shard, pool, id, 10*time.Second, 5, 64)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := b.js.CreateOrUpdateConsumer(ctx, protocol.TaskStream(shard), cfg)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := b.js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	p := protocol.Presence{ID: id, Pool: pool, Capabilities: caps, Actions: []string{"echo"}, MaxConcurrent: 64,
		TaskStream: protocol.TaskStream(shard), TaskSubject: protocol.TaskSubject(shard, pool, id)}
	heartbeat := func() {
		p.HeartbeatAt = time.Now()
		v, _ := json.Marshal(p)
		_, _ = kv.Put(ctx, protocol.PresenceKey(pool, id), v)
	}
	heartbeat()
	wg.Add(2)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				heartbeat()
			}
		}
	}()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			msgs, err := cons.Fetch(16, jetstream.FetchMaxWait(200*time.Millisecond))
			if err != nil {
				continue
			}
			for m := range msgs.Messages() {
				a.handle(ctx, b.js, m)
			}
		}
	}()
	return a
}

func (a *handAgent) handle(ctx context.Context, js jetstream.JetStream, m jetstream.Msg) {
	var task protocol.Task
	if err := json.Unmarshal(m.Data(), &task); err != nil {
		_ = m.Term()
		return
	}
	a.mu.Lock()
	a.tasks = append(a.tasks, task)
	reply := a.reply
	a.mu.Unlock()
	r := protocol.Result{Status: protocol.ResultSucceeded, Output: task.Params}
	if reply != nil {
		r = reply(task)
	}
	r.JobID, r.StepID, r.Epoch, r.Agent = task.JobID, task.StepID, task.Epoch, a.id
	r.StartedAt, r.FinishedAt = time.Now(), time.Now()
	if err := publishResult(ctx, js, r); err != nil {
		return
	}
	_ = m.Ack()
}

func (a *handAgent) received() []protocol.Task {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]protocol.Task(nil), a.tasks...)
}

func publishResult(ctx context.Context, js jetstream.JetStream, r protocol.Result) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(protocol.ResultSubject(r.JobID, r.StepID))
	msg.Data = b
	msg.Header.Set(protocol.HeaderJob, r.JobID)
	msg.Header.Set(protocol.HeaderStep, r.StepID)
	msg.Header.Set(protocol.HeaderEpoch, strconv.FormatUint(r.Epoch, 10))
	msg.Header.Set(protocol.HeaderMsgID, protocol.ResultMsgID(r.JobID, r.StepID, r.Epoch)+"."+r.Status+"."+r.FinishedAt.String())
	_, err = js.PublishMsg(ctx, msg)
	return err
}

// streamMsgs counts messages stored on a stream's subject filter so far
// (work-queue streams delete acked messages, so use LastSeq).
func lastSeq(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

var errNotYet = errors.New("not yet")

func testLogger(t *testing.T) zerolog.Logger {
	if !testing.Verbose() {
		return zerolog.Nop()
	}
	return zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger()
}

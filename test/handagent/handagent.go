// Package handagent is an agent written by hand from docs/protocol.md,
// for tests that need exact control over what an agent does: it keeps a
// presence entry alive, consumes its task subject and publishes results.
package handagent

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// handAgent speaks the agent protocol by hand, as docs/protocol.md shows:
// it keeps a presence entry alive and answers its tasks.
type Agent struct {
	id, pool string
	mu       sync.Mutex
	tasks    []protocol.Task
	reply    func(protocol.Task) protocol.Result
	cancel   context.CancelFunc
	// reported in heartbeats, as a real agent's counters
	succeeded, failed uint64
	draining          bool
	orders            []string
	kv                jetstream.KeyValue
}

// Options tune the agent's consumer.
type Options struct {
	AckWait    time.Duration // default 10s
	MaxDeliver int           // default 5
}

// Drop is a result status that makes the agent Nak the task and report
// nothing, as an agent crashing mid-task would (but faster).
const Drop = "drop"

// Start runs a hand agent until the test ends.
func Start(t testing.TB, js jetstream.JetStream, pool, id string, caps []string, opts ...Options) *Agent {
	t.Helper()
	a := &Agent{id: id, pool: pool}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	shard := protocol.Shard(pool, id, streams.DefaultTaskShards)
	o := Options{AckWait: 10 * time.Second, MaxDeliver: 5}
	for _, x := range opts {
		if x.AckWait > 0 {
			o.AckWait = x.AckWait
		}
		if x.MaxDeliver != 0 {
			o.MaxDeliver = x.MaxDeliver
		}
	}
	cfg, err := streams.TaskConsumer(shard, pool, id, o.AckWait, o.MaxDeliver, 64)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, protocol.TaskStream(shard), cfg)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	p := protocol.Presence{ID: id, Pool: pool, Capabilities: caps, Actions: []string{"echo"}, MaxConcurrent: 64,
		TaskStream: protocol.TaskStream(shard), TaskSubject: protocol.TaskSubject(shard, pool, id)}
	heartbeat := func() {
		a.mu.Lock()
		p.HeartbeatAt = time.Now()
		p.Succeeded, p.Failed, p.Draining = a.succeeded, a.failed, a.draining
		a.mu.Unlock()
		v, _ := json.Marshal(p)
		_, _ = kv.Put(ctx, protocol.PresenceKey(pool, id), v)
	}
	a.kv = kv
	// Orders on the control subject are obeyed as far as presence goes
	// (drain shows as draining) and recorded.
	sub, err := js.Conn().Subscribe(protocol.AgentControlSubject(pool, id), func(m *nats.Msg) {
		var c protocol.Control
		_ = json.Unmarshal(m.Data, &c)
		a.mu.Lock()
		a.orders = append(a.orders, c.Op)
		switch c.Op {
		case protocol.ControlDrain:
			a.draining = true
		case protocol.ControlUndrain:
			a.draining = false
		}
		a.mu.Unlock()
		_ = m.Respond([]byte("ok"))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
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
				a.handle(ctx, js, m)
			}
		}
	}()
	return a
}

func (a *Agent) handle(ctx context.Context, js jetstream.JetStream, m jetstream.Msg) {
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
	if r.Status == Drop {
		_ = m.Nak()
		return
	}
	r.JobID, r.StepID, r.Epoch, r.Agent = task.JobID, task.StepID, task.Epoch, a.id
	r.StartedAt, r.FinishedAt = time.Now(), time.Now()
	if err := PublishResult(ctx, js, r); err != nil {
		return
	}
	_ = m.Ack()
}

// Received returns the tasks received so far.
func (a *Agent) Received() []protocol.Task {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]protocol.Task(nil), a.tasks...)
}

// PublishResult publishes r as an agent would.
func PublishResult(ctx context.Context, js jetstream.JetStream, r protocol.Result) error {
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

// Reply sets how tasks are answered; nil answers success echoing the params.
// A reply that blocks holds the task unacknowledged.
func (a *Agent) Reply(f func(protocol.Task) protocol.Result) {
	a.mu.Lock()
	a.reply = f
	a.mu.Unlock()
}

// Stop stops heartbeats and consumption without removing presence, as a
// crash would; the presence expires with the bucket's TTL.
func (a *Agent) Stop() { a.cancel() }

// Leave removes the agent's presence at once, as a clean shutdown does.
func (a *Agent) Leave() {
	a.cancel()
	_ = a.kv.Delete(context.Background(), protocol.PresenceKey(a.pool, a.id))
}

// Report sets the cumulative counters the next heartbeats carry, so a test
// can make the agent look as healthy or sick as it needs.
func (a *Agent) Report(succeeded, failed uint64) {
	a.mu.Lock()
	a.succeeded, a.failed = succeeded, failed
	a.mu.Unlock()
}

// Orders returns the control ops received so far.
func (a *Agent) Orders() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.orders...)
}

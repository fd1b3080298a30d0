package scheduler_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
)

// A scheduler that reads a job again publishes the tasks of its recent
// dispatches again (the same Nats-Msg-Id, a duplicate the task stream
// drops), in case their publish was lost. Recent must mean the current
// epoch's dispatch: judged by the record's updated_at, which a cancel
// writes, a step cancelled more than the stream's 2 min duplicate window
// after its dispatch had its task published again, stored as a new
// message, and run a second time by its agent.
//
// The scheduler's clock runs 3 min behind while it dispatches, so the
// dispatch is older than the window when the test acts; the server's own
// window is real time, so what is checked is the publication itself (a
// core subscription sees every publish, stored or dropped).
func TestRepublishFollowsTheDispatchNotTheRecord(t *testing.T) {
	t.Parallel()
	two := `{"name":"r","steps":[{"id":"s","action":"echo","timeout":"1h"},{"id":"t","action":"echo","timeout":"1h"}]}`
	cases := []struct {
		name  string
		spec  string
		old   bool // dispatched longer ago than republishWithin
		act   func(t *testing.T, b *bundle, id string)
		again int // tasks expected to be published again
	}{
		{"inline job cancelled", `{"name":"r","steps":[{"id":"s","action":"echo","timeout":"1h"}]}`, true,
			func(t *testing.T, b *bundle, id string) { cancelJob(t, b, id) }, 0},
		{"job of two steps cancelled, then read again", two, true,
			func(t *testing.T, b *bundle, id string) {
				cancelJob(t, b, id) // the scheduler writes desired cancelled on the steps
				requireDispatched(t, b, id, "s", "t")
				advance(t, b, id)
			}, 0},
		{"record written since its dispatch", two, true,
			func(t *testing.T, b *bundle, id string) {
				// Any write of the record that is not a dispatch.
				b.editStep(t, id, "s", func(st *jobstore.Step) { st.UpdatedAt = time.Now().UTC() })
				advance(t, b, id)
			}, 0},
		{"recent dispatch read again", two, false,
			func(t *testing.T, b *bundle, id string) { advance(t, b, id) }, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var skew atomic.Int64
			if c.old {
				skew.Store(int64(-3 * time.Minute))
			}
			clock := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
			b.startScheduler(t, scheduler.Config{}, scheduler.WithClock(clock))
			startMute(t, b, "mute")
			tasks := watchTasks(t, b)
			const id = "job-republish"
			b.submitNoReply(t, []byte(c.spec), id)
			snap := waitAllDispatched(t, b, id)
			natstest.Eventually(t, 10*time.Second, "every task published", func() bool {
				tasks.drain(t, 10*time.Millisecond)
				return tasks.total() == len(snap.Steps)
			})
			skew.Store(0)
			c.act(t, b, id)
			// The scheduler published any task again before it answered the
			// request that read the job, on the connection that answers: what
			// it published is in the subscription's queue by now.
			tasks.drain(t, 200*time.Millisecond)
			if got := tasks.total() - len(snap.Steps); got != c.again {
				t.Fatalf("tasks published again: %d, want %d (%v)", got, c.again, tasks.byID)
			}
		})
	}
}

// startMute announces agent id of pool default, offering echo, until the
// test ends; it takes no task and obeys no order (a cancel does not end
// its steps, as an SDK agent's report of the cancel would).
func startMute(t *testing.T, b *bundle, id string) {
	t.Helper()
	kv, err := b.js.KeyValue(context.Background(), protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	shard := protocol.Shard("default", id, scheduler.Config{}.WithDefaults().TaskShards)
	started := time.Now().UTC()
	a, err := presence.NewAnnouncer(kv, presence.AnnouncerConfig{Pool: "default", ID: id,
		Presence: func() protocol.Presence {
			return protocol.Presence{ID: id, Pool: "default", Actions: []string{"echo"}, MaxConcurrent: 8, Host: "test", PID: 1,
				StartedAt: started, TaskStream: protocol.TaskStream(shard), TaskSubject: protocol.TaskSubject(shard, "default", id)}
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		<-a.Done()
	})
}

// taskWatch counts the task publications by Nats-Msg-Id.
type taskWatch struct {
	sub  *nats.Subscription
	byID map[string]int
}

func watchTasks(t *testing.T, b *bundle) *taskWatch {
	t.Helper()
	sub, err := b.nc.SubscribeSync(protocol.SubjectTaskPrefix + ".>")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &taskWatch{sub: sub, byID: map[string]int{}}
}

// drain takes what the subscription holds, waiting up to quiet for more.
func (w *taskWatch) drain(t *testing.T, quiet time.Duration) {
	t.Helper()
	for {
		m, err := w.sub.NextMsg(quiet)
		if errors.Is(err, nats.ErrTimeout) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		w.byID[m.Header.Get(protocol.HeaderMsgID)]++
	}
}

func (w *taskWatch) total() int {
	n := 0
	for _, c := range w.byID {
		n += c
	}
	return n
}

// waitAllDispatched waits until every step of job id is dispatched.
func waitAllDispatched(t *testing.T, b *bundle, id string) *jobstore.Snapshot {
	t.Helper()
	var snap *jobstore.Snapshot
	natstest.Eventually(t, 10*time.Second, id+" dispatched", func() bool {
		var err error
		snap, err = b.store.Load(context.Background(), id)
		if err != nil || len(snap.Steps) == 0 {
			return false
		}
		for _, st := range snap.Steps {
			if st.State != jobstore.StepDispatched {
				return false
			}
		}
		return true
	})
	return snap
}

// requireDispatched fails the test unless the steps are still dispatched.
func requireDispatched(t *testing.T, b *bundle, job string, steps ...string) {
	t.Helper()
	for _, id := range steps {
		st, _, err := b.store.Step(context.Background(), job, id)
		if err != nil || st.State != jobstore.StepDispatched {
			t.Fatalf("step %s.%s is no longer dispatched (%v): the test proves nothing", job, id, err)
		}
	}
}

func cancelJob(t *testing.T, b *bundle, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.New(b.js, client.Options{}).Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// advance asks a scheduler to read job id again and waits for its answer.
func advance(t *testing.T, b *bundle, id string) {
	t.Helper()
	m, err := b.nc.Request(protocol.SubjectControlAdvance, []byte(id), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := protocol.ParseReply(m.Data); err != nil {
		t.Fatal(err)
	}
}

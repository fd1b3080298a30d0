package supervisor_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
	"github.com/wardenhq/warden/test/handagent"
)

// answers records the leader's advance requests and the answers they got,
// from copies of both (a plain subscription beside the schedulers' queue
// group, and one on every inbox).
type answers struct {
	mu      sync.Mutex
	asked   map[string]string // reply subject → job
	answers map[string]int    // job → answers
	signal  chan string       // a job whose request was answered
}

func watchAdvances(t *testing.T, nc *nats.Conn) *answers {
	t.Helper()
	a := &answers{asked: map[string]string{}, answers: map[string]int{}, signal: make(chan string, 64)}
	for subject, cb := range map[string]nats.MsgHandler{
		protocol.SubjectControlAdvance: func(m *nats.Msg) {
			a.mu.Lock()
			defer a.mu.Unlock()
			a.asked[m.Reply] = string(m.Data)
		},
		"_INBOX.>": func(m *nats.Msg) {
			a.mu.Lock()
			job, ok := a.asked[m.Subject]
			if ok {
				a.answers[job]++
			}
			a.mu.Unlock()
			if ok && strings.Contains(string(m.Data), `"ok":true`) {
				select {
				case a.signal <- job:
				default:
				}
			}
		},
	} {
		sub, err := nc.Subscribe(subject, cb)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return a
}

// answered waits until a request about job is answered ok.
func (a *answers) answered(t *testing.T, job string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case got := <-a.signal:
			if got == job {
				return
			}
		case <-deadline:
			t.Fatalf("no advance request about %s answered within %s", job, within)
		}
	}
}

// The chaos suite's network partitions (seeds 4242 and 31337): a job's
// first step waited 90-107 s before its dispatch. The scheduler that
// accepted it found every agent busy, kept the job in its memory (a bare
// submission is acknowledged, not held) and was killed; after the recovery
// grace the leader asked a scheduler to advance the job; the one that
// answered found no free agent either, parked the job in its memory,
// answered ok, and was killed a moment later. Nothing held the job any
// more, and the leader, told "ok", asked again only twice the grace later
// (60 s): the answer counted as a move. Here the scheduler that answers
// finds no agent at all, and is stopped once it has answered; another
// scheduler and an agent come at once. The job must not wait for a
// backoff that trusted the stopped scheduler: it is asked about again and
// dispatched well within one grace.
func TestJobParkedByASchedulerThatWentIsAskedAboutSoon(t *testing.T) {
	t.Parallel()
	const grace = 8 * time.Second
	srv, nc, js := natstest.Start(t, streams.Options{})
	store, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{srv: srv, nc: nc, js: js, store: store}
	seen := watchAdvances(t, nc)
	stopFirst := b.scheduler(t, scheduler.Config{})
	v := b.supervisor(t, supervisor.Config{RecoveryGrace: protocol.Duration(grace),
		RecoveryRetry: protocol.Duration(100 * time.Millisecond), FailureThreshold: protocol.Duration(time.Hour)})
	waitClosed(t, v.Leading(), "the supervisor leads")

	// No agent: the first scheduler accepts the job and parks it.
	b.submit(t, "job-parked", `{"name":"parked","steps":[{"id":"s","action":"echo"}]}`)
	natstest.Eventually(t, 10*time.Second, "the job is accepted and waits for an agent", func() bool {
		st := b.step(t, "job-parked", "s")
		return st != nil && st.State == jobstore.StepPending && st.Waiting != ""
	})

	// After the grace the leader asks; the first scheduler (the only one)
	// answers, having parked the job again, and goes.
	seen.answered(t, "job-parked", 2*grace)
	stopFirst()
	went := time.Now()
	b.scheduler(t, scheduler.Config{})
	handagent.Start(t, js, "default", "a1", []string{"x"})

	natstest.Eventually(t, grace, "the parked job's step is dispatched within the grace after the scheduler that answered went",
		func() bool {
			st := b.step(t, "job-parked", "s")
			return st != nil && st.State != jobstore.StepPending
		})
	t.Logf("dispatched %s after the scheduler that answered went", time.Since(went).Round(10*time.Millisecond))
}

package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/procs"
)

// TestTransferNotTakenUpIsRetriedThenTakenUp and
// TestTransferNotTakenUpGivesUp enforce the failover policy's
// task_transfer_timeout and max_transfer_retries (docs/clusters.md, "Task
// transfer") with the real scheduler, supervisor and agent processes. A
// step runs on member a; the other members, b and c, are alive and report
// but their task consumers are paused (a wedged dispatch loop: the server
// delivers them nothing). a is killed with -9: the supervisor moves the
// step to b or c, nobody takes it up within the 2 s timeout, so it is moved
// again, to the other one (an event and a metric say so). Then either that
// member wakes up and runs it, or, with the one retry spent, the step is
// dead-lettered with reason transfer_timeout.
func TestTransferNotTakenUpIsRetriedThenTakenUp(t *testing.T) {
	t.Parallel()
	// 5 s: time enough to wake the member up between the retry and the
	// next verdict.
	x := startTransfer(t, "txok", 5*time.Second)
	ev := x.waitRetry()
	first := ev.Data["member"]
	var second string
	natstest.Eventually(t, 30*time.Second, "the step is dispatched again", func() bool {
		st := x.step()
		second = st.Pool + "." + st.Actor
		return st.State == jobstore.StepDispatched && second != first
	})
	if second == "p.a" {
		t.Fatalf("transfer retry: step moved back to the dead member")
	}
	_, id, _ := strings.Cut(second, ".")
	x.resume(id)
	resumed := time.Now()
	var st *jobstore.Step
	natstest.Eventually(t, 60*time.Second, "the moved step succeeds on the member it was moved to", func() bool {
		st = x.step()
		return st.State == jobstore.StepSucceeded
	})
	if st.Actor != id {
		t.Fatalf("step succeeded on %s, want %s", st.Actor, id)
	}
	t.Logf("a killed; moved to %s, not taken up in %s: %s; moved to %s, which took it up once resumed (done %s later, a 40 s sleep); chain: %s",
		first, x.timeout, ev.Reason, second, time.Since(resumed).Round(time.Second), chain(st))
	if got := x.metric(`warden_cluster_transfer_retries_total{cluster="txok"}`); got != "1" {
		t.Fatalf("warden_cluster_transfer_retries_total = %q, want 1", got)
	}
}

func TestTransferNotTakenUpGivesUp(t *testing.T) {
	t.Parallel()
	x := startTransfer(t, "txgone", 2*time.Second)
	ev := x.waitRetry()
	var st *jobstore.Step
	natstest.Eventually(t, 60*time.Second, "the step is dead-lettered once its one retry is spent", func() bool {
		st = x.step()
		return st.State == jobstore.StepDeadLettered
	})
	if !strings.Contains(st.LastError, "task_transfer_timeout") {
		t.Fatalf("dead-lettered with %q, want the transfer timeout named", st.LastError)
	}
	// The chain: transferred off a, moved again off the first member, parked
	// while on a second one.
	n := len(st.Attempts)
	if n < 3 || st.Attempts[n-3].Agent != "a" || st.Attempts[n-2].Agent == st.Attempts[n-1].Agent ||
		st.Attempts[n-1].Status != string(protocol.DLQTransferTimeout) {
		t.Fatalf("retry chain %s: want a, then two different members", chain(st))
	}
	dl := x.events(protocol.EventDeadLettered)
	if len(dl) != 1 || dl[0].Data["reason"] != string(protocol.DLQTransferTimeout) {
		t.Fatalf("dead_lettered events %+v, want one with reason transfer_timeout", dl)
	}
	if got := x.metric(`warden_dead_letters_total{reason="transfer_timeout"}`); got != "1" {
		t.Fatalf("warden_dead_letters_total{reason=transfer_timeout} = %q, want 1", got)
	}
	if got := x.metric(`warden_cluster_transfer_retries_total{cluster="txgone"}`); got != "1" {
		t.Fatalf("warden_cluster_transfer_retries_total = %q, want 1", got)
	}
	t.Logf("retry: %s; then: %s; chain: %s", ev.Reason, st.LastError, chain(st))
}

type transferEnv struct {
	t       *testing.T
	h       *harness
	store   *jobstore.Store
	job     string
	metrics string
	timeout time.Duration
}

// startTransfer runs the scenario up to the kill of a: an active_active
// cluster (one retry), a's step running, b and c paused.
func startTransfer(t *testing.T, name string, timeout time.Duration) *transferEnv {
	d := definition(name, protocol.ModeActiveActive)
	d.Failover.TaskTransferTimeout = protocol.Duration(timeout)
	d.Failover.MaxTransferRetries = 1
	h := newHarness(t, d, true)
	x := &transferEnv{t: t, h: h, metrics: freeAddr(t), timeout: timeout}
	procs.Start(t, "scheduler", schedulerBin, "--server", h.srv.URL)
	procs.Start(t, "supervisor", supervisorBin, "--server", h.srv.URL, "--metrics-addr", x.metrics)
	var err error
	if x.store, err = jobstore.Open(context.Background(), h.js); err != nil {
		t.Fatal(err)
	}
	h.start("a")
	natstest.Eventually(t, 30*time.Second, "a is a member", func() bool { return roleOf(h.state(), "a") == protocol.RoleMember })
	c, err := client.Connect(h.srv.URL, client.Options{Name: "transfer-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	spec := fmt.Sprintf("name: %s\nsteps:\n  - {id: s, action: sleep, cluster: %s, params: {duration: 40s}, timeout: 5m}\n", name, name)
	r, err := c.Submit(context.Background(), []byte(spec), client.SubmitOptions{NoReply: true})
	if err != nil {
		t.Fatal(err)
	}
	x.job = r.JobID
	natstest.Eventually(t, 30*time.Second, "the step runs on a", func() bool {
		st := x.step()
		return st != nil && st.State == jobstore.StepDispatched && st.Actor == "a" && x.delivered("a")
	})
	for _, id := range []string{"b", "c"} {
		h.start(id)
	}
	natstest.Eventually(t, 30*time.Second, "three members", func() bool { return strings.Count(roles(h.state()), "=member") == 3 })
	for _, id := range []string{"b", "c"} {
		x.pause(id)
	}
	h.proc("a").Kill()
	return x
}

// step reads the job's step; nil until the scheduler has written it.
func (x *transferEnv) step() *jobstore.Step {
	st, _, err := x.store.Step(context.Background(), x.job, "s")
	if errors.Is(err, jobstore.ErrNotFound) || errors.Is(err, jobstore.ErrConflict) {
		// Not written yet, or written between the read and the leader's
		// check (ErrBehindLeader, a conflict: read again).
		return nil
	}
	if err != nil {
		x.t.Fatal(err)
	}
	return st
}

func (x *transferEnv) consumer(id string) (jetstream.Consumer, string, error) {
	stream := protocol.TaskStream(protocol.Shard("p", id, shards))
	c, err := x.h.js.Consumer(context.Background(), stream, id)
	return c, stream, err
}

// delivered reports whether agent id's consumer delivered anything.
func (x *transferEnv) delivered(id string) bool {
	c, _, err := x.consumer(id)
	if err != nil {
		return false
	}
	info, err := c.Info(context.Background())
	return err == nil && info.Delivered.Stream > 0
}

// pause stops the server delivering to agent id's task consumer, once the
// agent has made it: the agent keeps reporting and stays a member.
func (x *transferEnv) pause(id string) {
	natstest.Eventually(x.t, 30*time.Second, id+"'s task consumer exists", func() bool {
		_, _, err := x.consumer(id)
		return err == nil
	})
	_, stream, _ := x.consumer(id)
	if _, err := x.h.js.PauseConsumer(context.Background(), stream, id, time.Now().Add(time.Hour)); err != nil {
		x.t.Fatal(err)
	}
}

func (x *transferEnv) resume(id string) {
	_, stream, _ := x.consumer(id)
	if _, err := x.h.js.ResumeConsumer(context.Background(), stream, id); err != nil {
		x.t.Fatal(err)
	}
}

func (x *transferEnv) events(kind protocol.EventKind) []protocol.Event {
	es, err := events.List(context.Background(), x.h.js, kind, 100)
	if err != nil {
		x.t.Fatal(err)
	}
	var out []protocol.Event
	for _, e := range es {
		if e.JobID == x.job {
			out = append(out, e)
		}
	}
	return out
}

// waitRetry waits for the one cluster_transfer_retry event of the job.
func (x *transferEnv) waitRetry() protocol.Event {
	var es []protocol.Event
	natstest.Eventually(x.t, 60*time.Second, "a cluster_transfer_retry event", func() bool {
		es = x.events(protocol.EventClusterTransferRetry)
		return len(es) > 0
	})
	e := es[0]
	if e.Data["retry"] != "1" || e.Data["max_retries"] != "1" || e.Data["member"] == "" || e.Data["member"] == "p.a" {
		x.t.Fatalf("retry event %+v: want retry 1 of 1 off b or c", e)
	}
	return e
}

// metric reads one sample of the supervisor's /metrics.
func (x *transferEnv) metric(series string) string {
	resp, err := http.Get("http://" + x.metrics + "/metrics")
	if err != nil {
		x.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		x.t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

func chain(st *jobstore.Step) string {
	var parts []string
	for _, a := range st.Attempts {
		parts = append(parts, a.Agent+":"+a.Status)
	}
	return strings.Join(parts, " -> ")
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			t.Log(err)
		}
	}()
	return ln.Addr().String()
}

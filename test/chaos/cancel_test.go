package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/procs"
)

// Cancel while every agent holding the job's steps is frozen (SIGSTOP): the
// job ends cancelled (never succeeded) once the frozen steps' leases end,
// and after the agents resume no step of it runs that had not started
// before the cancel took effect.
func TestCancelWhileAgentsAreStopped(t *testing.T) {
	if !*fullFlag {
		t.Skip("real processes frozen past their leases: make chaos runs it (-chaos.full)")
	}
	// A short grace: a frozen agent's lease ends soon after its step's timeout.
	cfg := filepath.Join(t.TempDir(), "scheduler.yaml")
	if err := os.WriteFile(cfg, []byte("dispatch_grace: 1s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sc := newScenario(t, "--config", cfg)
	c, js, ledger := sc.c, sc.js, sc.ledger
	sc.supervisor("sup-c")
	var agents []*procs.Proc
	for i := range 3 {
		id := fmt.Sprintf("cx-%d", i)
		agents = append(agents, sc.agent(id))
	}
	waitFor(t, 30*time.Second, "3 agents present", func() bool { return presentAgents(js) == 3 })

	var sb strings.Builder
	sb.WriteString(`{"name":"frozen","steps":[`)
	for i := range 40 {
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, `{"id":"s%02d","action":"ledger","timeout":"3s","params":{"duration":"2s"}}`, i)
	}
	sb.WriteString("]}")
	if _, err := js.Publish(context.Background(), protocol.SubmitSubject("job-frozen"), []byte(sb.String())); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "steps running", func() bool { return ledgerLines(t, ledger, "job-frozen") >= 6 })
	for _, a := range agents {
		_ = a.Signal(syscall.SIGSTOP)
	}
	cl, err := client.Connect(c.url, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cancelAt := time.Now()
	rep, err := cl.Cancel(ctx, "job-frozen")
	if err != nil {
		t.Fatal(err)
	}
	tookEffect := time.Now()
	ran := ledgerLines(t, ledger, "job-frozen") // the cancel has taken effect
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	var j *jobstore.Job
	waitFor(t, 30*time.Second, "job ended", func() bool {
		got, _, err := store.Job(ctx, "job-frozen")
		j = got
		return err == nil && got.State.Terminal()
	})
	// The steps as the job ended: none may change once the agents resume.
	atEnd := map[string]*jobstore.Step{}
	endSteps, err := store.Steps(ctx, j)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range endSteps {
		atEnd[st.ID] = st.Step
	}
	resumed := time.Now()
	for _, a := range agents {
		_ = a.Signal(syscall.SIGCONT)
	}
	// Resumed agents heartbeat again; by then they have looked at every
	// task they held (and dropped those past their deadline).
	waitFor(t, 30*time.Second, "agents heartbeating after SIGCONT", func() bool {
		return heartbeatsAfter(js, resumed.Add(2*time.Second)) == 3
	})
	// The resumed agents report what they held; give the schedulers time
	// to apply (and drop) those results, then read the job again.
	time.Sleep(3 * time.Second)
	after := ledgerLines(t, ledger, "job-frozen")
	again, _, err := store.Job(ctx, "job-frozen")
	if err != nil {
		t.Fatal(err)
	}
	if again.State != jobstore.JobCancelled || !again.FinishedAt.Equal(j.FinishedAt) {
		t.Errorf("after the agents resumed the job is %s (finished %s), it ended %s (finished %s)",
			again.State, again.FinishedAt, j.State, j.FinishedAt)
	}
	nowSteps, err := store.Steps(ctx, again)
	if err != nil {
		t.Fatal(err)
	}
	succeeded := 0
	for _, st := range nowSteps {
		if st.State == jobstore.StepSucceeded {
			succeeded++
			if st.FinishedAt.After(tookEffect) {
				t.Errorf("step %s succeeded at %s, after the cancel took effect at %s (epoch %d on %s)",
					st.ID, st.FinishedAt.Format(time.RFC3339Nano), tookEffect.Format(time.RFC3339Nano), st.Epoch, st.Actor)
			}
		}
		if prev := atEnd[st.ID]; prev == nil || prev.State != st.State || !prev.FinishedAt.Equal(st.FinishedAt) {
			was := "missing"
			if prev != nil {
				was = string(prev.State)
			}
			t.Errorf("step %s changed after the job ended cancelled: %s then, %s now (epoch %d on %s)", st.ID, was, st.State, st.Epoch, st.Actor)
		}
	}
	t.Logf("after the agents resumed: job %s, %d of %d steps succeeded (all before the cancel)", again.State, succeeded, len(nowSteps))
	t.Logf("cancel: %d pending cancelled, %d running frozen; job %s %s after the cancel began (the frozen steps' leases); %d executions before it took effect, %d after the agents resumed",
		len(rep.Cancelled), len(rep.Interrupted), j.State, j.FinishedAt.Sub(cancelAt).Round(time.Millisecond), ran, after-ran)
	if j.State != jobstore.JobCancelled {
		t.Fatalf("job ended %s, want cancelled", j.State)
	}
	if after != ran {
		t.Fatalf("%d executions of the cancelled job's steps started after the cancel took effect", after-ran)
	}
}

// ledgerLines counts the ledger's executions of a job's steps.
func ledgerLines(t *testing.T, path, job string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, job+" ") {
			n++
		}
	}
	return n
}

// heartbeatsAfter counts agents whose presence heartbeat is after t.
func heartbeatsAfter(js jetstream.JetStream, t time.Time) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		return 0
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return 0
	}
	n := 0
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue
		}
		var p protocol.Presence
		if json.Unmarshal(e.Value(), &p) == nil && p.HeartbeatAt.After(t) {
			n++
		}
	}
	return n
}

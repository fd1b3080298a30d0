package chaos

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
)

type plan struct {
	jobs, poison           int
	submitWindow, chaosFor time.Duration
	drain                  time.Duration
}

func TestChaos(t *testing.T) {
	p := plan{jobs: 60, poison: 2, submitWindow: 15 * time.Second, chaosFor: 25 * time.Second, drain: 150 * time.Second}
	seed := *seedFlag
	if *fullFlag {
		p = plan{jobs: 240, poison: 6, submitWindow: 45 * time.Second, chaosFor: 60 * time.Second, drain: 240 * time.Second}
		if seed == 0 {
			seed = time.Now().UnixNano() % 1_000_000
		}
	} else if seed == 0 {
		seed = 1
	}
	t.Logf("chaos seed %d (replay: go test ./test/chaos -run TestChaos -chaos.seed=%d%s)", seed, seed, map[bool]string{true: " -chaos.full"}[*fullFlag])
	rnd := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	jobs := generate(rnd, p.jobs, p.poison)

	c := newCluster(t)
	nc, err := nats.Connect(c.url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waitFor(t, 20*time.Second, "streams and buckets", func() bool {
		_, err := js.KeyValue(ctx, protocol.BucketJobs)
		return err == nil
	})
	watch := startSuccessWatch(ctx, t, js)
	defineChaosCluster(ctx, t, js)

	// Submit over the window; a publish that fails (the server is down)
	// is retried with the same Nats-Msg-Id until a PubAck accepts it.
	var accepted sync.Map
	var submitWG sync.WaitGroup
	submitWG.Add(1)
	go func() {
		defer submitWG.Done()
		gap := p.submitWindow / time.Duration(len(jobs))
		for _, j := range jobs {
			for ctx.Err() == nil {
				msg := nats.NewMsg(protocol.SubjectSubmit)
				msg.Data = j.spec
				msg.Header.Set(protocol.HeaderJobID, j.id)
				msg.Header.Set(protocol.HeaderMsgID, j.id)
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := js.PublishMsg(pctx, msg)
				pcancel()
				if err == nil {
					accepted.Store(j.id, j)
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			time.Sleep(gap)
		}
	}()

	// The fault schedule, drawn from the same seed.
	leases, _ := waitKV(ctx, t, js, protocol.BucketLeases)
	kvGet := func(key string) ([]byte, error) {
		e, err := leases.Get(ctx, key)
		if err != nil {
			return nil, err
		}
		return e.Value(), nil
	}
	counts := map[string]int{}
	start := time.Now()
	natsRestartAt := start.Add(p.chaosFor / 2)
	natsRestarted := false
	next := start.Add(time.Second)
	agents := []string{"agent-0", "agent-1", "agent-2", "agent-3"}
	for now := time.Now(); now.Sub(start) < p.chaosFor; now = time.Now() {
		c.tend(now)
		if !natsRestarted && now.After(natsRestartAt) {
			c.restartNATS()
			natsRestarted = true
			counts["nats restarts"]++
		}
		if now.After(next) {
			down := time.Duration(300+rnd.IntN(2700)) * time.Millisecond
			switch roll := rnd.IntN(100); {
			case roll < 35:
				if c.kill(agents[rnd.IntN(len(agents))], now, down) {
					counts["agent kills"]++
				}
			case roll < 55:
				pause := time.Duration(1000+rnd.IntN(5000)) * time.Millisecond
				if c.pause(agents[rnd.IntN(len(agents))], now, pause) {
					counts["agent pauses"]++
				}
			case roll < 75:
				if c.kill("scheduler-"+strconv.Itoa(rnd.IntN(2)), now, down) {
					counts["scheduler kills"]++
				}
			case roll < 90:
				if l := c.supervisorLeader(kvGet); l != "" && c.kill(l, now, down) {
					counts["supervisor leader kills"]++
				}
			}
			next = now.Add(time.Duration(500+rnd.IntN(1000)) * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
	}
	submitWG.Wait()
	c.settle()
	chaosEnd := time.Now()

	// Drain: every accepted job must reach a terminal state. Poison tasks
	// keep killing agents until they are parked, so keep tending.
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	accepted.Range(func(k, _ any) bool { ids = append(ids, k.(string)); return true })
	sort.Strings(ids)
	terminal := func() (int, []string) {
		var pending []string
		for _, id := range ids {
			j, _, err := store.Job(ctx, id)
			if err != nil || !j.State.Terminal() {
				pending = append(pending, id)
			}
		}
		return len(ids) - len(pending), pending
	}
	deadline := time.Now().Add(p.drain)
	var stuck []string
	for {
		c.tend(time.Now())
		var done int
		done, stuck = terminal()
		if len(stuck) == 0 || time.Now().After(deadline) {
			_ = done
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	drained := time.Since(chaosEnd)
	if len(stuck) > 0 {
		for _, id := range stuck[:min(len(stuck), 10)] {
			t.Errorf("job %s not terminal after %s: %s", id, p.drain, describeJob(ctx, store, id))
		}
		if path := dumpJobLogs(c, stuck[:min(len(stuck), 10)]); path != "" {
			t.Logf("every process's log lines about the stuck jobs: %s", path)
		}
		t.Fatalf("%d of %d accepted jobs not terminal", len(stuck), len(ids))
	}

	// The drain time is the slowest job's story: name it, with its logs.
	var last *jobstore.Job
	for _, id := range ids {
		if j, _, err := store.Job(ctx, id); err == nil && (last == nil || j.FinishedAt.After(last.FinishedAt)) {
			last = j
		}
	}
	if last != nil {
		t.Logf("seed %d: last job to finish: %s, %s after the faults stopped: %s; every process's lines about it: %s",
			seed, last.ID, last.FinishedAt.Sub(chaosEnd).Round(time.Millisecond), describeJob(ctx, store, last.ID),
			dumpJobLogs(c, []string{last.ID}))
	}

	// Verify.
	byID := map[string]job{}
	for _, j := range jobs {
		byID[j.id] = j
	}
	runs := readLedger(t, c.ledger)
	executions := map[string]int{} // job.step → runs
	for _, r := range runs {
		executions[r.job+"."+r.step]++
	}
	poisonSteps := map[string]bool{}
	clusterOwner := map[uint64]string{} // cluster epoch → the member that completed its steps
	for _, id := range ids {
		j := byID[id]
		rec, _, err := store.Job(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		steps, err := store.Steps(ctx, rec)
		if err != nil {
			t.Fatal(err)
		}
		if j.poison != "" {
			poisonSteps[id+"."+j.poison] = true
			if rec.State != jobstore.JobFailed {
				t.Errorf("poison job %s is %s", id, rec.State)
			}
		} else if want := cmp.Or(jobstore.JobState(j.want), jobstore.JobSucceeded); rec.State != want {
			t.Errorf("job %s (%s) is %s, want %s: %s", id, j.shape, rec.State, want, describeJob(ctx, store, id))
		}
		for _, s := range steps {
			key := id + "." + s.ID
			if j.poison == s.ID && s.State != jobstore.StepDeadLettered {
				t.Errorf("poison step %s is %s, not dead-lettered", key, s.State)
			}
			if s.State == jobstore.StepSucceeded && executions[key] == 0 {
				t.Errorf("step %s succeeded but never ran according to the ledger: %s (actor %s, epoch %d); every process's lines about its job: %s",
					key, describeJob(ctx, store, id), s.Actor, s.Epoch, dumpJobLogs(c, []string{id}))
			}
			if s.Cluster != "" && s.State == jobstore.StepSucceeded {
				if o, ok := clusterOwner[s.ClusterEpoch]; ok && o != s.Actor {
					t.Errorf("cluster epoch %d: steps completed by both %s and %s (%s)", s.ClusterEpoch, o, s.Actor, key)
				}
				clusterOwner[s.ClusterEpoch] = s.Actor
			}
		}
	}
	for key, n := range watch.successes() {
		if n > 1 {
			t.Errorf("step %s went to succeeded %d times (job store watch)", key, n)
		}
	}
	for key, n := range loggedSuccesses(c) {
		if n > 1 {
			t.Errorf("step %s went to succeeded %d times (scheduler logs)", key, n)
		}
	}
	q, err := dlq.Open(ctx, nc, js)
	if err != nil {
		t.Fatal(err)
	}
	letters, err := q.List(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	inDLQ := map[string]int{}
	for _, l := range letters {
		inDLQ[l.JobID+"."+l.StepID]++
	}
	for key := range poisonSteps {
		if inDLQ[key] == 0 {
			t.Errorf("poison step %s is not in the dead-letter stream", key)
		}
	}
	for key, n := range inDLQ {
		if !poisonSteps[key] {
			t.Errorf("dead-letter stream holds %s (%d letters), which is not a poison step", key, n)
		}
	}

	acceptedJobs := map[string]job{}
	for _, id := range ids {
		acceptedJobs[id] = byID[id]
	}
	sagas := checkUndoOrder(t, runs, acceptedJobs)
	shapes := map[string]int{}
	for _, id := range ids {
		shapes[byID[id].shape]++
	}

	// Counts.
	duplicates := 0
	for _, n := range executions {
		duplicates += n - 1
	}
	failovers, transferred := 0, 0
	for _, e := range readEvents(ctx, js, "failover") {
		if e.Data["outcome"] != "nothing_to_move" {
			failovers++
		}
		n, _ := strconv.Atoi(e.Data["tasks_moved"])
		transferred += n
	}
	restarts := 0
	for _, r := range c.roles {
		restarts += r.restarts
	}
	t.Logf("seed %d: %d jobs accepted (%d poison), %d agent kills, %d agent pauses, %d scheduler kills, %d supervisor leader kills, %d nats restarts, %d process restarts",
		seed, len(ids), len(poisonSteps), counts["agent kills"], counts["agent pauses"], counts["scheduler kills"],
		counts["supervisor leader kills"], counts["nats restarts"], restarts)
	t.Logf("seed %d: %d failovers, %d tasks transferred, %d executions of %d steps (%d duplicate), %d stale results dropped, %d dead letters, drained %s after the faults stopped",
		seed, failovers, transferred, len(runs), len(executions), duplicates,
		len(readEvents(ctx, js, protocol.EventStaleResult)), len(letters), drained.Round(time.Millisecond))
	t.Logf("seed %d: shapes %v; %d sagas compensated in reverse order", seed, shapes, sagas)
	again := rerunsOfOneDispatch(runs, poisonSteps)
	t.Logf("seed %d: of the %d duplicate executions, %d ran a dispatch again on the agent that already ran it (%d of a poison step; %d others after the agent restarted, %d in the same agent process), %d on another agent; %d were new dispatches (retries, failover moves, poison)",
		seed, duplicates, again.sameAgent(), again.poison, again.restarted, len(again.inProcess),
		again.otherAgent, duplicates-again.sameAgent()-again.otherAgent)
	for _, r := range again.inProcess[:min(len(again.inProcess), 10)] {
		t.Logf("seed %d: ran again in the same agent process: %s", seed, r)
	}
}

// reruns counts executions of a dispatch (job, step, epoch) after its
// first: on the agent that ran it already, split into poison steps (each
// run crashed the agent), runs after the agent process restarted (a run
// killed with it) and runs repeated by a live process (inProcess,
// described); or on another agent.
type reruns struct {
	poison, restarted, otherAgent int
	inProcess                     []string
}

func (r reruns) sameAgent() int { return r.poison + r.restarted + len(r.inProcess) }

// rerunsOfOneDispatch splits the ledger's repeated executions of a single
// dispatch by where they ran. A dispatch's epoch is new for each retry and
// each failover move, so these are the duplicates no decision asked for:
// a lease that ran out (a paused or killed agent), a redelivery after a
// server restart.
func rerunsOfOneDispatch(runs []ledgerRun, poison map[string]bool) reruns {
	last := map[string]map[string]ledgerRun{} // job.step.epoch → agent → its last run there
	var out reruns
	for _, r := range runs {
		key := r.job + "." + r.step + "." + r.epoch
		if last[key] == nil {
			last[key] = map[string]ledgerRun{}
		}
		prev, again := last[key][r.agent]
		switch {
		case len(last[key]) == 0:
		case !again:
			out.otherAgent++
		case poison[r.job+"."+r.step]:
			out.poison++
		case prev.pid != r.pid:
			out.restarted++
		default:
			out.inProcess = append(out.inProcess, fmt.Sprintf("%s on %s (pid %s), %d ms after the run before",
				key, r.agent, r.pid, r.at-prev.at))
		}
		last[key][r.agent] = r
	}
	return out
}

// dumpJobLogs writes every line that names one of ids from every process
// that ran (killed ones included) to a file that outlives the test, and
// returns its path ("" if it could not be written): a stuck job's story
// is spread over schedulers, supervisors and agents.
func dumpJobLogs(c *cluster, ids []string) string {
	f, err := os.CreateTemp("", "chaos-stuck-*.log")
	if err != nil {
		return ""
	}
	defer f.Close()
	names := make([]string, 0, len(c.roles))
	for name := range c.roles {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for i, p := range c.roles[name].history {
			sc := bufio.NewScanner(strings.NewReader(p.Output()))
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				for _, id := range ids {
					if strings.Contains(sc.Text(), id) {
						fmt.Fprintf(f, "%s#%d %s\n", name, i, sc.Text())
						break
					}
				}
			}
		}
	}
	return f.Name()
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitKV(ctx context.Context, t *testing.T, js jetstream.JetStream, bucket string) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	waitFor(t, 20*time.Second, "bucket "+bucket, func() bool {
		var err error
		kv, err = js.KeyValue(ctx, bucket)
		return err == nil
	})
	return kv, nil
}

func describeJob(ctx context.Context, store *jobstore.Store, id string) string {
	j, _, err := store.Job(ctx, id)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	b.WriteString(string(j.State))
	steps, _ := store.Steps(ctx, j)
	for _, s := range steps {
		b.WriteString(" | " + s.ID + "=" + string(s.State) + "@" + strconv.FormatUint(s.Epoch, 10) + " on " + s.Actor)
		if s.Waiting != "" {
			b.WriteString(" waiting: " + s.Waiting)
		}
		if s.LastError != "" {
			b.WriteString(" error: " + s.LastError)
		}
	}
	return b.String()
}

// ledgerRun is one line of the ledger: one execution, as the test agent
// writes it ("job step epoch agent pid unix-millis").
type ledgerRun struct {
	job, step, epoch, agent, pid string
	at                           int64
}

// readLedger returns the ledger's executions in the order they began (the
// agents append with O_APPEND and sync every line).
func readLedger(t *testing.T, path string) []ledgerRun {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []ledgerRun
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 6 {
			t.Fatalf("ledger line %q is not: job step epoch agent pid unix-millis", sc.Text())
		}
		at, _ := strconv.ParseInt(fields[5], 10, 64)
		out = append(out, ledgerRun{job: fields[0], step: fields[1], epoch: fields[2], agent: fields[3], pid: fields[4], at: at})
	}
	return out
}

func readEvents(ctx context.Context, js jetstream.JetStream, kind protocol.EventKind) []protocol.Event {
	evs, _ := events.List(ctx, js, kind, 0)
	return evs
}

// loggedSuccesses counts "step succeeded" lines, which a scheduler logs
// after its CAS write to succeeded won, across every scheduler process that
// ever ran.
func loggedSuccesses(c *cluster) map[string]int {
	out := map[string]int{}
	for _, name := range []string{"scheduler-0", "scheduler-1"} {
		for _, p := range c.roles[name].history {
			sc := bufio.NewScanner(strings.NewReader(p.Output()))
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				var line struct {
					Message string `json:"message"`
					Job     string `json:"job_id"`
					Step    string `json:"step_id"`
				}
				if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "step succeeded" {
					out[line.Job+"."+line.Step]++
				}
			}
		}
	}
	return out
}

// successWatch follows the job store and counts, per step, the revisions at
// which it entered succeeded.
type successWatch struct {
	mu    sync.Mutex
	state map[string]jobstore.StepState
	rev   map[string]uint64
	count map[string]int
}

func startSuccessWatch(ctx context.Context, t *testing.T, js jetstream.JetStream) *successWatch {
	w := &successWatch{state: map[string]jobstore.StepState{}, rev: map[string]uint64{}, count: map[string]int{}}
	kv, _ := waitKV(ctx, t, js, protocol.BucketJobs)
	watcher, err := kv.Watch(ctx, "step.>")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer func() { _ = watcher.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-watcher.Updates():
				if !ok {
					return
				}
				if e == nil || e.Operation() != jetstream.KeyValuePut {
					continue
				}
				var st jobstore.Step
				if json.Unmarshal(e.Value(), &st) != nil {
					continue
				}
				key := st.JobID + "." + st.ID
				w.mu.Lock()
				if e.Revision() > w.rev[key] {
					if st.State == jobstore.StepSucceeded && w.state[key] != jobstore.StepSucceeded {
						w.count[key]++
					}
					w.state[key], w.rev[key] = st.State, e.Revision()
				}
				w.mu.Unlock()
			}
		}
	}()
	return w
}

func (w *successWatch) successes() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int, len(w.count))
	for k, v := range w.count {
		out[k] = v
	}
	return out
}

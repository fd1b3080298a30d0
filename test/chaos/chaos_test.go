package chaos

import (
	"bufio"
	"cmp"
	"context"
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
	"github.com/wardenhq/warden/test/procs"
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
	keepLogs(t, c)
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
	watch := startTransitionWatch(ctx, t, js)
	keepRecords(ctx, t, js)
	defineChaosCluster(ctx, t, js)
	dups, err := startRepublisher(nc, js, seed)
	if err != nil {
		t.Fatal(err)
	}

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
	parts := newPartitioner(c, seed, *fullFlag, start, func() string { return c.liveLeader(kvGet) })
	proxies := map[string]*procs.Proxy{}
	for name, r := range c.roles {
		proxies[name] = r.proxy
	}
	go parts.probe.run(ctx, js, c.ledger, start, proxies, func(j job) { accepted.Store(j.id, j) })
	// Two server restarts, at a third and two thirds of the window: the
	// first graceful (SIGTERM), the second SIGKILL (same store dir).
	natsRestarts := []time.Time{start.Add(p.chaosFor / 3), start.Add(2 * p.chaosFor / 3)}
	next := start.Add(time.Second)
	agents := []string{"agent-0", "agent-1", "agent-2", "agent-3"}
	for now := time.Now(); now.Sub(start) < p.chaosFor; now = time.Now() {
		c.tend(now)
		parts.tend(now, counts)
		if len(natsRestarts) > 0 && now.After(natsRestarts[0]) {
			kill := len(natsRestarts) == 1
			c.restartNATS(kill)
			natsRestarts = natsRestarts[1:]
			counts[map[bool]string{false: "nats restarts", true: "nats kills"}[kill]]++
		}
		if now.After(next) {
			// Most kills are short; one in four keeps the process down
			// 5-10 s, past an agent's lease and the failure threshold, so
			// that the recovery paths (failover, lease takeover) run.
			down := time.Duration(300+rnd.IntN(2700)) * time.Millisecond
			long := rnd.IntN(4) == 0
			if long {
				down = time.Duration(5000+rnd.IntN(5000)) * time.Millisecond
			}
			killed := func(kind, name string) {
				if c.kill(name, now, down) {
					counts[kind]++
					if long {
						counts["long kills"]++
						counts["long "+kind]++
					}
				}
			}
			switch roll := rnd.IntN(100); {
			case roll < 30:
				if counts["long agent kills"] == 0 {
					// The first agent kill is a long one: a seed whose long
					// kills all fell on schedulers and supervisors ran no
					// failover (seed 897425), and the check below that
					// one happened had nothing to see.
					long, down = true, time.Duration(5000+rnd.IntN(5000))*time.Millisecond
				}
				killed("agent kills", agents[rnd.IntN(len(agents))])
			case roll < 45:
				pause := time.Duration(1000+rnd.IntN(5000)) * time.Millisecond
				if c.pause(agents[rnd.IntN(len(agents))], now, pause) {
					counts["agent pauses"]++
				}
			case roll < 60:
				killed("scheduler kills", "scheduler-"+strconv.Itoa(rnd.IntN(2)))
			case roll < 72:
				pause := time.Duration(1000+rnd.IntN(7000)) * time.Millisecond
				if c.pause("scheduler-"+strconv.Itoa(rnd.IntN(2)), now, pause) {
					counts["scheduler pauses"]++
				}
			case roll < 87:
				if l := c.supervisorLeader(kvGet); l != "" {
					killed("supervisor leader kills", l)
				}
			}
			next = now.Add(time.Duration(500+rnd.IntN(1000)) * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
	}
	submitWG.Wait()
	parts.finish()
	if parts.probe.agent != "" {
		counts["agent blackholes"]++
	}
	c.settle()
	counts["republished results"], counts["republished tasks"] = dups.finish()
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
	for _, j := range parts.probe.jobs {
		byID[j.id] = j
	}
	runs := readLedger(t, c.ledger)
	executions := map[string]int{} // job.step → runs
	ranAs := map[string]bool{}     // job.step.epoch.agent → ran
	for _, r := range runs {
		executions[r.job+"."+r.step]++
		ranAs[r.job+"."+r.step+"."+r.epoch+"."+r.agent] = true
	}
	// The leader each cluster epoch elected, from cluster_leader_elected
	// events (Agent is the leader's presence key, <pool>.<agent>).
	leaderEvents, err := readEvents(ctx, js, protocol.EventClusterLeader)
	if err != nil {
		t.Fatalf("read cluster_leader_elected events: %v", err)
	}
	epochLeader := map[uint64]string{}
	for _, e := range leaderEvents {
		if e.Data["cluster"] != chaosCluster {
			continue
		}
		if n, err := strconv.ParseUint(e.Data["epoch"], 10, 64); err == nil {
			epochLeader[n] = e.Agent
		}
	}
	finalJobs := map[string]*jobstore.Job{}
	finalSteps := map[string]*jobstore.Step{}
	fenced, leaderChecked := 0, 0
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
		} else if !strings.HasPrefix(rec.Error, j.wantError) {
			t.Errorf("job %s (%s) is %s with error %q, want one starting %q: %s", id, j.shape, rec.State, rec.Error, j.wantError,
				describeJob(ctx, store, id))
		}
		finalJobs[id] = rec
		if j.shape == "timed" && executions[id+".t2"] > 0 {
			t.Errorf("timed job %s ran its last step after its timeout: %s", id, describeJob(ctx, store, id))
		}
		for _, s := range steps {
			key := id + "." + s.ID
			finalSteps[key] = s.Step
			// Fencing, against the ledger: the result that won was
			// produced by an execution of that very dispatch (epoch) on
			// that agent.
			if s.State == jobstore.StepSucceeded && s.LastError != "record expired with the job's retention" {
				fenced++
				if !ranAs[key+"."+strconv.FormatUint(s.Epoch, 10)+"."+s.Actor] {
					t.Errorf("step %s succeeded with epoch %d on %s, but the ledger has no execution of that epoch on that agent: %s",
						key, s.Epoch, s.Actor, describeJob(ctx, store, id))
				}
			}
			if s.Cluster != "" && s.State == jobstore.StepSucceeded {
				if l, ok := epochLeader[s.ClusterEpoch]; ok {
					leaderChecked++
					if l != s.Actor && !strings.HasSuffix(l, "."+s.Actor) {
						t.Errorf("cluster step %s completed by %s under cluster epoch %d, whose elected leader was %s", key, s.Actor, s.ClusterEpoch, l)
					}
				}
			}
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
	stepsSeen, jobsSeen := watch.check(t, finalJobs, finalSteps)
	doubles := 0
	for _, n := range watch.successes() {
		doubles += n - 1
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
		if inDLQ[key] != 1 {
			t.Errorf("poison step %s has %d letters in the dead-letter stream, want 1", key, inDLQ[key])
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
	failoverEvents, err := readEvents(ctx, js, protocol.EventFailover)
	if err != nil {
		t.Fatalf("read failover events: %v", err)
	}
	stale, err := readEvents(ctx, js, protocol.EventStaleResult)
	if err != nil {
		t.Fatalf("read stale_result events: %v", err)
	}
	for _, e := range failoverEvents {
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
	t.Logf("seed %d: %d jobs accepted (%d poison), %d agent kills, %d agent pauses, %d scheduler kills, %d scheduler pauses, %d supervisor leader kills (%d kills of 5-10 s), %d nats restarts, %d nats kills, %d results and %d tasks republished, %d process restarts",
		seed, len(ids), len(poisonSteps), counts["agent kills"], counts["agent pauses"], counts["scheduler kills"], counts["scheduler pauses"],
		counts["supervisor leader kills"], counts["long kills"], counts["nats restarts"], counts["nats kills"],
		counts["republished results"], counts["republished tasks"], restarts)
	t.Logf("seed %d: %d failovers, %d tasks transferred, %d executions of %d steps (%d duplicate), %d stale results dropped, %d dead letters, drained %s after the faults stopped",
		seed, failovers, transferred, len(runs), len(executions), duplicates,
		len(stale), len(letters), drained.Round(time.Millisecond))
	t.Logf("seed %d: job store watch saw %d succeeded steps and %d terminal jobs in their final state, %d double successes; %d successes fenced against the ledger, %d cluster steps checked against their epoch's elected leader (%d leader events)",
		seed, stepsSeen, jobsSeen, doubles, fenced, leaderChecked, len(leaderEvents))
	partitionStory, partitionProblems := parts.report()
	probeStory, probeProblems := parts.probe.check(finalSteps, stale)
	t.Logf("seed %d: %d agent blackholes, %d agent cuts, %d scheduler blackholes, %d scheduler cuts, %d supervisor leader blackholes; %s",
		seed, counts["agent blackholes"], counts["agent cuts"], counts["scheduler blackholes"], counts["scheduler cuts"],
		counts["supervisor leader blackholes"], probeStory)
	for _, line := range partitionStory {
		t.Logf("seed %d: %s", seed, line)
	}
	for _, p := range append(probeProblems, partitionProblems...) {
		t.Errorf("seed %d: %s", seed, p)
	}
	if *fullFlag {
		for _, kind := range []string{"agent kills", "agent pauses", "scheduler kills", "scheduler pauses", "supervisor leader kills",
			"long kills", "nats restarts", "nats kills", "republished results", "republished tasks",
			"agent blackholes", "agent cuts", "scheduler blackholes", "scheduler cuts", "supervisor leader blackholes"} {
			if counts[kind] == 0 {
				t.Errorf("seed %d: no %s happened: the full run must exercise every fault", seed, kind)
			}
		}
		if failovers == 0 {
			t.Errorf("seed %d: no failover happened: the recovery path did not run", seed)
		}
		if len(stale) == 0 {
			t.Errorf("seed %d: no stale result was dropped although %d results were republished", seed, counts["republished results"])
		}
	}
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

// readEvents lists the stored events of a kind; an error is the caller's to
// fail on: a count read as 0 because the read failed proves nothing.
func readEvents(ctx context.Context, js jetstream.JetStream, kind protocol.EventKind) ([]protocol.Event, error) {
	return events.List(ctx, js, kind, 0)
}

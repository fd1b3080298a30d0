package scheduler_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/concurrency"
	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ratelimit"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// runs records what the agents themselves saw: when each execution of a
// step started and finished, by agent.
type runs struct {
	mu   sync.Mutex
	list []run
}

type run struct {
	job, agent    string
	start, finish time.Time // finish zero: the agent died holding it
}

func (r *runs) script(agentID string, hold time.Duration) agenttest.Script {
	return func(ctx context.Context, t *agent.Task) (any, error) {
		r.mu.Lock()
		k := len(r.list)
		r.list = append(r.list, run{job: t.JobID, agent: agentID, start: time.Now()})
		r.mu.Unlock()
		select {
		case <-time.After(hold):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		r.mu.Lock()
		r.list[k].finish = time.Now()
		r.mu.Unlock()
		return "ok", nil
	}
}

func (r *runs) snapshot() []run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.list)
}

func startSchedulers(t *testing.T, b *bundle, n int, cfg scheduler.Config) {
	t.Helper()
	for range n {
		b.startScheduler(t, cfg)
	}
}

func publishJobs(t *testing.T, b *bundle, n int, prefix, body string) []string {
	t.Helper()
	var ids []string
	var msgs []*nats.Msg
	for i := range n {
		id := fmt.Sprintf("%s-%04d", prefix, i)
		ids = append(ids, id)
		m := nats.NewMsg(protocol.SubmitSubject(id))
		m.Data = []byte(body)
		m.Header.Set(protocol.HeaderJobID, id)
		msgs = append(msgs, m)
	}
	natstest.PublishAll(t, b.js, msgs...)
	return ids
}

func (b *bundle) allEnded(t *testing.T, ids []string) (succeeded int, ok bool) {
	t.Helper()
	for _, id := range ids {
		j, _, err := b.store.Job(context.Background(), id)
		if err != nil || !j.State.Terminal() {
			return succeeded, false
		}
		if j.State == jobstore.JobSucceeded {
			succeeded++
		}
	}
	return succeeded, true
}

// TestDelayedJobStartsOnTime: a job submitted with delay: 2s through the
// client is not started by an agent before 2 s have passed, and starts
// within its dispatch latency after.
func TestDelayedJobStartsOnTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "a1", Pool: "default"})
	var rs runs
	a.Script(rs.script("a1", 0))
	c := client.New(b.js, client.Options{})
	submitted := time.Now()
	rc, err := c.Submit(context.Background(), []byte(`{"name":"later","delay":"2s","steps":[{"id":"s","action":"echo"}]}`), client.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rc.StartsAt.Before(submitted.Add(2 * time.Second)) {
		t.Fatalf("receipt says it starts at %s, before its delay", rc.StartsAt)
	}
	b.waitJob(t, rc.JobID, jobstore.JobSucceeded)
	got := rs.snapshot()
	if len(got) != 1 {
		t.Fatalf("%d executions, want 1", len(got))
	}
	if early := rc.StartsAt.Sub(got[0].start); early > 0 {
		t.Fatalf("the agent started the step %s before its time", early)
	}
	t.Logf("delay 2s: the agent started the step %s after submission, %s after its time",
		got[0].start.Sub(submitted).Round(time.Millisecond), got[0].start.Sub(rc.StartsAt).Round(time.Millisecond))
}

// TestConcurrencyKeyNeverOverlaps: 500 jobs share a concurrency key with
// limit 1, a scheduler dispatches them to three agents, and one agent is
// killed while it holds the key (the supervisor takes its step back). From the agents' own start and finish
// records, no two executions ever overlap (a killed agent's execution
// counts as running until its lease ended), and every job succeeds.
func TestConcurrencyKeyNeverOverlaps(t *testing.T) {
	if testing.Short() {
		t.Skip("500 jobs")
	}
	// Not parallel: it measures nothing, but a CPU-starved run takes
	// minutes; the other tests run after it.
	const jobs = 500
	b := setup(t)
	cfg := scheduler.Config{DispatchGrace: protocol.Duration(time.Second), CapacityRetry: protocol.Duration(50 * time.Millisecond)}
	startSchedulers(t, b, 1, cfg)
	runSupervisor(t, b, supervisor.Config{RecoveryGrace: protocol.Duration(200 * time.Millisecond)})
	var rs runs
	var agents []*agenttest.Agent
	for i := range 3 {
		id := fmt.Sprintf("a%d", i)
		a := agenttest.StartAgent(t, b.nc, agent.Config{ID: id, Pool: "default", MaxConcurrent: 4})
		a.Script(rs.script(id, time.Millisecond))
		agents = append(agents, a)
	}
	body := `{"name":"sync","concurrency":{"key":"customer-42","limit":1},"steps":[{"id":"s","action":"echo","timeout":"2s"}]}`
	ids := publishJobs(t, b, jobs, "conc", body)

	// Kill agent a0 while it holds the key: swap its script for one that
	// blocks, wait until it took a task, then crash it.
	victim := agents[0]
	taken := make(chan struct{}, 1)
	var killedAt time.Time
	victim.Script(func(ctx context.Context, task *agent.Task) (any, error) {
		rs.mu.Lock()
		rs.list = append(rs.list, run{job: task.JobID, agent: "a0", start: time.Now()})
		rs.mu.Unlock()
		select {
		case taken <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	select {
	case <-taken:
		// Stop returns once the runtime stopped: the handler has returned,
		// so the killed execution ends no later than now.
		victim.Stop()
		killedAt = time.Now()
	case <-time.After(60 * time.Second):
		t.Fatal("agent a0 never took a task")
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if _, ok := b.allEnded(t, ids); ok {
			break
		}
		if time.Now().After(deadline) {
			ended := 0
			for _, id := range ids {
				if j, _, err := b.store.Job(context.Background(), id); err == nil && j.State.Terminal() {
					ended++
				}
			}
			st, _ := concurrency.New(context.Background(), b.js, concurrency.Config{})
			state, _ := st.Inspect(context.Background(), "customer-42")
			t.Fatalf("after 3m: %d of %d jobs ended, %d executions; key: %+v", ended, jobs, len(rs.snapshot()), state)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n, _ := b.allEnded(t, ids); n != jobs {
		t.Fatalf("%d of %d jobs succeeded", n, jobs)
	}
	got := rs.snapshot()
	// The killed execution ran until the agent was killed.
	for k := range got {
		if got[k].finish.IsZero() {
			got[k].finish = killedAt
		}
	}
	if o := overlaps(got); len(o) > 0 {
		t.Fatal(o[0])
	}
	// Throughput, logged, never asserted: the median handoff (one
	// execution's finish to the next one's start) is the key's own cost.
	gaps := make([]time.Duration, 0, len(got))
	for k := 1; k < len(got); k++ {
		gaps = append(gaps, got[k].start.Sub(got[k-1].finish))
	}
	slices.Sort(gaps)
	span := got[len(got)-1].finish.Sub(got[0].start)
	t.Logf("%d jobs, key limit 1, 3 agents, a0 killed at %s holding the key: %d executions, none overlapping; "+
		"%.1f jobs/s over %s, median handoff %s",
		jobs, killedAt.Format(time.StampMilli), len(got), float64(len(got))/span.Seconds(), span.Round(time.Millisecond),
		gaps[len(gaps)/2].Round(10*time.Microsecond))
}

// TestRateLimitAcrossSchedulers: 600 jobs whose step uses a 50/s limit,
// two schedulers: every job succeeds, and the agents' start times never
// show more than 50/s + 10%. The rate achieved is logged, not asserted:
// speed is for benchmarks.
func TestRateLimitAcrossSchedulers(t *testing.T) {
	if testing.Short() {
		t.Skip("12 s")
	}
	// Not parallel: the rate is logged.
	const rate, jobs = 50, 600
	b := setup(t)
	cfg := scheduler.Config{RateLimits: ratelimit.Config{"crm": {Limit: rate, Interval: protocol.Duration(time.Second)}}}
	startSchedulers(t, b, 2, cfg)
	var rs runs
	for i := range 2 {
		id := fmt.Sprintf("a%d", i)
		a := agenttest.StartAgent(t, b.nc, agent.Config{ID: id, Pool: "default", MaxConcurrent: 16})
		a.Script(rs.script(id, 0))
	}
	ids := publishJobs(t, b, jobs, "rl", `{"name":"call","steps":[{"id":"s","action":"echo","rate_limit":"crm"}]}`)
	natstest.Eventually(t, 2*time.Minute, "every job ended", func() bool {
		_, ok := b.allEnded(t, ids)
		return ok
	})
	if n, _ := b.allEnded(t, ids); n != jobs {
		t.Fatalf("%d of %d jobs succeeded", n, jobs)
	}
	got := rs.snapshot()
	slices.SortFunc(got, func(x, y run) int { return x.start.Compare(y.start) })
	// The steady state: the 10 s after the first second (which may hold
	// the burst).
	from := got[0].start.Add(time.Second)
	n := 0
	for _, r := range got {
		if !r.start.Before(from) && r.start.Before(from.Add(10*time.Second)) {
			n++
		}
	}
	perSec := float64(n) / 10
	t.Logf("rate limit %d/s, 2 schedulers: %d starts in 10 s (%.1f/s); %d jobs took %s",
		rate, n, perSec, len(got), got[len(got)-1].start.Sub(got[0].start).Round(time.Millisecond))
	if perSec > rate*1.1 {
		t.Fatalf("%.1f starts/s, more than %d/s + 10%%", perSec, rate)
	}
}

func runSupervisor(t *testing.T, b *bundle, cfg supervisor.Config) {
	t.Helper()
	nc, _ := b.srv.Connect(t)
	v, err := supervisor.New(cfg, nc, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- v.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// TestHighPriorityOvertakesBacklog: 1,000 low-priority jobs wait for one
// agent that runs one step at a time; then a high-priority job and 100
// more low-priority jobs are submitted. The agent starts the high-priority
// job before any low-priority job submitted after it.
func TestHighPriorityOvertakesBacklog(t *testing.T) {
	if testing.Short() {
		t.Skip("1,100 jobs")
	}
	b := setup(t)
	b.startScheduler(t, scheduler.Config{CapacityRetry: protocol.Duration(50 * time.Millisecond)})
	var rs runs
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "solo", Pool: "default", MaxConcurrent: 1})
	a.Script(rs.script("solo", time.Millisecond))
	low := `{"name":"low","priority":"low","steps":[{"id":"s","action":"echo"}]}`
	before := publishJobs(t, b, 1000, "low-before", low)
	natstest.Eventually(t, 30*time.Second, "a backlog is being worked off", func() bool { return len(rs.snapshot()) >= 20 })
	high := publishJobs(t, b, 1, "high", `{"name":"high","priority":"high","steps":[{"id":"s","action":"echo"}]}`)
	after := publishJobs(t, b, 100, "low-after", low)
	all := append(append(before, high...), after...)
	natstest.Eventually(t, 3*time.Minute, "every job ended", func() bool { _, ok := b.allEnded(t, all); return ok })
	got := rs.snapshot()
	slices.SortFunc(got, func(x, y run) int { return x.start.Compare(y.start) })
	pos := map[string]int{}
	for k, r := range got {
		if _, ok := pos[r.job]; !ok {
			pos[r.job] = k
		}
	}
	hp, firstAfter := pos[high[0]], len(got)
	for _, id := range after {
		firstAfter = min(firstAfter, pos[id])
	}
	lowBeforeAfterHigh := 0
	for _, id := range before {
		if pos[id] > hp {
			lowBeforeAfterHigh++
		}
	}
	t.Logf("backlog of 1000 low: the high job started %d-th; the first low job submitted after it started %d-th; %d earlier low jobs started after it",
		hp+1, firstAfter+1, lowBeforeAfterHigh)
	if hp > firstAfter {
		t.Fatalf("the high-priority job started after a low-priority job submitted after it")
	}
}

// TestCompensationInReverseOrder: reserve-seat -> reserve-car -> charge;
// charge fails permanently. The compensations of the two steps that
// succeeded run, car's before seat's (reverse dependency order), and the
// job ends compensated. When seat's compensation keeps failing it is
// retried (max_retries 1: two attempts) and the job ends
// compensation_failed.
func TestCompensationInReverseOrder(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		undoFail bool
		want     jobstore.JobState
	}{
		{"compensated", false, jobstore.JobCompensated},
		{"compensation_failed", true, jobstore.JobCompensationFailed},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.startScheduler(t, scheduler.Config{})
			a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "a1", Pool: "default"})
			var mu sync.Mutex
			var order []string
			a.Script(func(ctx context.Context, task *agent.Task) (any, error) {
				mu.Lock()
				order = append(order, task.StepID)
				mu.Unlock()
				switch {
				case task.StepID == "charge":
					return nil, agent.Permanent(fmt.Errorf("card declined"))
				case task.StepID == "seat_compensate" && c.undoFail:
					return nil, agent.Retriable(fmt.Errorf("seat service down"))
				}
				return "ok", nil
			})
			spec := `{"name":"trip","steps":[
 {"id":"seat","action":"echo","compensate":{"action":"echo","max_retries":1,"retry":{"base_backoff":"10ms"}}},
 {"id":"car","action":"echo","depends_on":["seat"],"compensate":{"action":"echo"}},
 {"id":"charge","action":"echo","depends_on":["car"],"compensate":{"action":"echo"}}]}`
			publishJobs(t, b, 1, "trip", spec)
			job := b.waitJob(t, "trip-0000", c.want)
			mu.Lock()
			got := strings.Join(order, " ")
			mu.Unlock()
			want := "seat car charge car_compensate seat_compensate"
			if c.undoFail {
				want += " seat_compensate"
			}
			if got != want {
				t.Fatalf("executions %q, want %q", got, want)
			}
			steps, err := b.store.Steps(context.Background(), job)
			if err != nil {
				t.Fatal(err)
			}
			var hist []string
			for _, s := range steps {
				hist = append(hist, fmt.Sprintf("%s:%s(%d)", s.ID, s.State, len(s.Attempts)))
			}
			for _, kind := range []protocol.EventKind{protocol.EventJobCompensating, protocol.EventJobCompensationEnded} {
				natstest.Eventually(t, 5*time.Second, "event "+string(kind), func() bool {
					evs, err := events.List(context.Background(), b.js, kind, 0)
					return err == nil && len(evs) == 1 && evs[0].JobID == job.ID
				})
			}
			t.Logf("job %s: %s; steps %v; error %q; events job_compensating, job_compensation_ended", job.ID, job.State, hist, job.Error)
		})
	}
}

// TestCancelWithCompensation: seat -> car -> wait; while wait runs the job
// is cancelled with compensation: wait is interrupted, then car's and
// seat's compensations run in that order and the job ends compensated.
func TestCancelWithCompensation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "a1", Pool: "default"})
	var mu sync.Mutex
	var order []string
	running := make(chan struct{}, 1)
	a.Script(func(ctx context.Context, task *agent.Task) (any, error) {
		mu.Lock()
		order = append(order, task.StepID)
		mu.Unlock()
		if task.StepID == "wait" {
			running <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return "ok", nil
	})
	publishJobs(t, b, 1, "trip", `{"name":"trip","steps":[
 {"id":"seat","action":"echo","compensate":{"action":"echo"}},
 {"id":"car","action":"echo","depends_on":["seat"],"compensate":{"action":"echo"}},
 {"id":"wait","action":"echo","depends_on":["car"],"compensate":{"action":"echo"}}]}`)
	select {
	case <-running:
	case <-time.After(20 * time.Second):
		t.Fatal("wait never started")
	}
	if _, err := client.New(b.js, client.Options{}).CancelCompensate(context.Background(), "trip-0000"); err != nil {
		t.Fatal(err)
	}
	job := b.waitJob(t, "trip-0000", jobstore.JobCompensated)
	mu.Lock()
	got := strings.Join(order, " ")
	mu.Unlock()
	if got != "seat car wait car_compensate seat_compensate" {
		t.Fatalf("executions %q", got)
	}
	t.Logf("cancelled with compensation: executions %q, job %s (%s)", got, job.State, job.Error)
}

// Compensation writes the new steps' records (round one), then the job
// record that adds them to the spec (round two). When round two failed (a
// lost race with a cancel, a write timeout, a shutdown), every reload
// planned the compensation again and created the records again: "exists",
// retried, handed back, forever. The records already there are now
// written over. Simulated by creating seat's compensation record before
// the job fails.
func TestCompensationAfterItsStepRecordsLandedAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "a1", Pool: "default"})
	release := make(chan struct{})
	a.Script(func(ctx context.Context, task *agent.Task) (any, error) {
		if task.StepID == "charge" {
			<-release
			return nil, agent.Permanent(fmt.Errorf("card declined"))
		}
		return "ok", nil
	})
	body := `{"name":"trip","steps":[
 {"id":"seat","action":"echo","compensate":{"action":"echo"}},
 {"id":"charge","action":"echo","depends_on":["seat"]}]}`
	b.submitNoReply(t, []byte(body), "job-stray")
	natstest.Eventually(t, 10*time.Second, "charge is running", func() bool {
		st, _, err := b.store.Step(context.Background(), "job-stray", "charge")
		return err == nil && st.State == jobstore.StepDispatched
	})
	sp, err := spec.Parse([]byte(body), spec.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	cs, _ := sp.Steps[0].CompensationStep()
	recs, err := jobstore.NewSteps("job-stray", spec.Job{Steps: []spec.Step{cs}}, jobstore.StepDefaults{Timeout: time.Minute}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.CreateStep(context.Background(), recs[0]); err != nil {
		t.Fatal(err)
	}
	close(release)
	j := b.waitJob(t, "job-stray", jobstore.JobCompensated)
	if st, _, err := b.store.Step(context.Background(), "job-stray", "seat_compensate"); err != nil || st.State != jobstore.StepSucceeded || j.ForwardSteps != 2 {
		t.Fatalf("compensation: %+v %v; job forward steps %d", st, err, j.ForwardSteps)
	}
}

// A concurrency key holds across schedulers. A freed slot wakes the job on
// every scheduler (gate_freed); the holder id is the step's, so the second
// to ask was granted as a renewal of the first's slot, and when its own
// dispatch then lost (the job record's compare-and-set, no agent), giving
// its grant back released the slot the winner's running step held: with two
// schedulers, most of 80 limit-1 jobs overlapped another. A give-back now
// releases only a slot it added and nobody renewed since.
func TestConcurrencyKeyHoldsAcrossSchedulers(t *testing.T) {
	if testing.Short() {
		t.Skip("80 jobs on two schedulers")
	}
	const jobs = 80
	b := setup(t)
	cfg := scheduler.Config{DispatchGrace: protocol.Duration(time.Second), CapacityRetry: protocol.Duration(50 * time.Millisecond)}
	startSchedulers(t, b, 2, cfg)
	var rs runs
	for i := range 2 {
		id := fmt.Sprintf("a%d", i)
		a := agenttest.StartAgent(t, b.nc, agent.Config{ID: id, Pool: "default", MaxConcurrent: 4})
		a.Script(rs.script(id, 30*time.Millisecond))
	}
	body := `{"name":"sync","concurrency":{"key":"shared","limit":1},"steps":[{"id":"s","action":"echo","timeout":"5s"}]}`
	ids := publishJobs(t, b, jobs, "two", body)
	natstest.Eventually(t, 3*time.Minute, "every job ended", func() bool {
		_, ok := b.allEnded(t, ids)
		return ok
	})
	got := rs.snapshot()
	if o := overlaps(got); len(o) > 0 {
		t.Fatalf("%d executions, %d overlapped another under a limit of 1; the first: %s", len(got), len(o), o[0])
	}
}

// overlaps sorts runs by start and says, for each that started before the
// one before it finished, which two they were.
func overlaps(got []run) []string {
	slices.SortFunc(got, func(x, y run) int { return x.start.Compare(y.start) })
	var out []string
	for k := 1; k < len(got); k++ {
		if got[k].start.Before(got[k-1].finish) {
			out = append(out, fmt.Sprintf("job %s started on %s at %s while job %s on %s ran until %s",
				got[k].job, got[k].agent, got[k].start.Format(time.StampMicro), got[k-1].job, got[k-1].agent, got[k-1].finish.Format(time.StampMicro)))
		}
	}
	return out
}

// A job's compensation starts when its last open step ends, whoever ends
// it. The turn's dispatch can: a cancel ends a step still pending (here
// waiting for a pool with no agents), an unknown action fails one. The
// turn asked for compensation before its dispatch only, found a step
// open, and then ended the job cancelled or failed with seat never undone.
func TestCompensationStartsWhenDispatchEndsTheLastStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, noStartGrace(scheduler.Config{}))
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "a1", Pool: "default"})
	var mu sync.Mutex
	var order []string
	a.Script(func(ctx context.Context, task *agent.Task) (any, error) {
		mu.Lock()
		order = append(order, task.JobID+"/"+task.StepID)
		mu.Unlock()
		return "ok", nil
	})
	executions := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(order, " ")
	}
	// A cancel with compensation while the last step waits for an agent.
	publishJobs(t, b, 1, "trip", `{"name":"trip","steps":[
 {"id":"seat","action":"echo","compensate":{"action":"echo"}},
 {"id":"car","action":"echo","pool":"nobody","depends_on":["seat"]}]}`)
	natstest.Eventually(t, 20*time.Second, "car waiting for an agent", func() bool {
		st, _, err := b.store.Step(context.Background(), "trip-0000", "car")
		return err == nil && st.State == jobstore.StepPending && st.Waiting != ""
	})
	if _, err := client.New(b.js, client.Options{}).CancelCompensate(context.Background(), "trip-0000"); err != nil {
		t.Fatal(err)
	}
	job := b.waitJobWithin(t, "trip-0000", jobstore.JobCompensated, 20*time.Second)
	// An action no agent of the pool offers fails the last step at dispatch.
	publishJobs(t, b, 1, "pay", `{"name":"pay","steps":[
 {"id":"seat","action":"echo","compensate":{"action":"echo"}},
 {"id":"charge","action":"no_such_action","depends_on":["seat"]}]}`)
	job2 := b.waitJobWithin(t, "pay-0000", jobstore.JobCompensated, 20*time.Second)
	got := executions()
	if got != "trip-0000/seat trip-0000/seat_compensate pay-0000/seat pay-0000/seat_compensate" {
		t.Fatalf("executions %q", got)
	}
	t.Logf("trip: %s (%s); pay: %s (%s)", job.State, job.Error, job2.State, job2.Error)
}

// A plain cancel of a job already compensating changes nothing but its
// desired state: the undo runs to its end, and the job's error still names
// the step that failed (it named the cancel instead).
func TestCancelDuringCompensationKeepsTheFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startScheduler(t, scheduler.Config{})
	a := agenttest.StartAgent(t, b.nc, agent.Config{ID: "a1", Pool: "default"})
	undoing := make(chan struct{}, 1)
	release := make(chan struct{})
	a.Script(func(ctx context.Context, task *agent.Task) (any, error) {
		switch task.StepID {
		case "charge":
			return nil, agent.Permanent(fmt.Errorf("card declined"))
		case "seat_compensate":
			undoing <- struct{}{}
			<-release
		}
		return "ok", nil
	})
	publishJobs(t, b, 1, "pay", `{"name":"pay","steps":[
 {"id":"seat","action":"echo","compensate":{"action":"echo"}},
 {"id":"charge","action":"echo","depends_on":["seat"]}]}`)
	select {
	case <-undoing:
	case <-time.After(20 * time.Second):
		t.Fatal("seat's compensation never started")
	}
	if _, err := client.New(b.js, client.Options{}).Cancel(context.Background(), "pay-0000"); err != nil {
		t.Logf("cancel: %v", err)
	}
	close(release)
	job := b.waitJobWithin(t, "pay-0000", jobstore.JobCompensated, 20*time.Second)
	if !strings.Contains(job.Error, "step charge failed") || !strings.Contains(job.Error, "card declined") {
		t.Fatalf("job %s with error %q; want it to name charge's failure", job.State, job.Error)
	}
}

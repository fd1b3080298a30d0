package chaos

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/procs"
)

// probe is the agent partition of both forms (partition_test.go): an
// agent blackholed while it runs the probe job's only step, until the
// supervisor has taken that step back from it (its presence and its task
// lease ran out) and, in the full form, for at least minFor. It runs on
// its own goroutine so that the agent is cut off within milliseconds of
// the step's start, whatever the chaos goroutine is doing (a graceful
// server restart holds it for seconds).
//
// The step lasts 1 s. The agent's handler therefore usually returns while
// the agent still believes in its lease (1.8 s): its success is published
// into the blackhole and reaches the server after the heal, where the step
// has moved on and the result must be dropped as stale. Otherwise the
// agent gives the lease up and reports nothing. A probe whose agent was cut
// off too late (its step succeeded first: the test process stalled for a
// second) is healed at once and tried again with another job, up to
// probeAttempts jobs.
type probe struct {
	at, minFor, maxFor time.Duration

	// Written by run, read after done.
	jobs          []job  // the probe jobs submitted, the last one the probe's
	agent, epoch  string // the agent that ran the last one's step first, and its dispatch
	takenBack     string // the step's record when it was first seen taken back
	tookBack      time.Duration
	rerun         string // "<agent>@<epoch>": a run elsewhere seen before the heal
	begun, healed time.Time
	tooLate       []string // attempts whose agent was cut off after the step succeeded
	problem       string

	done    chan struct{}
	cut     chan struct{} // closed once an agent is blackholed, or run gave up
	cutOnce sync.Once

	// victim is the agent's process, noted by the chaos goroutine (note).
	victim *procs.Proc
}

const (
	probeJobID    = "partition-probe"
	probeAttempts = 3
)

func newProbe(at, minFor, maxFor time.Duration) *probe {
	return &probe{at: at, minFor: minFor, maxFor: maxFor, done: make(chan struct{}), cut: make(chan struct{})}
}

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (pr *probe) finished() bool { return closed(pr.done) }

// cutOff reports whether an agent is blackholed (or the probe gave up):
// other agent partitions may begin.
func (pr *probe) cutOff() bool { return closed(pr.cut) }

// id is the id of the probe job being run.
func (pr *probe) id() string { return pr.jobs[len(pr.jobs)-1].id }

// run submits the probe job at start+at, blackholes the agent that starts
// it (proxies by role name), and heals it once the step was taken back
// and minFor has passed, or after maxFor (a problem).
func (pr *probe) run(ctx context.Context, js jetstream.JetStream, ledger string, start time.Time,
	proxies map[string]*procs.Proxy, accepted func(job)) {
	defer close(pr.done)
	defer pr.cutOnce.Do(func() { close(pr.cut) })
	if !sleepCtx(ctx, time.Until(start.Add(pr.at))) {
		return
	}
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		pr.problem = fmt.Sprintf("open the job store: %v", err)
		return
	}
	tail := &ledgerTail{path: ledger}
	for n := 1; n <= probeAttempts; n++ {
		id := probeJobID
		if n > 1 {
			id = fmt.Sprintf("%s-%d", probeJobID, n)
		}
		j := job{id: id, shape: "probe", spec: []byte(`{"name":"probe","steps":[{"id":"s","action":"ledger","params":{"duration":"1s"}}]}`)}
		if !submit(ctx, js, j) {
			return
		}
		pr.jobs = append(pr.jobs, j)
		accepted(j)
		if !pr.attempt(ctx, store, tail, proxies) || pr.problem != "" {
			return
		}
		if pr.takenBack != "" {
			return
		}
	}
	pr.problem = fmt.Sprintf("every agent was cut off after its probe step succeeded: %s", strings.Join(pr.tooLate, "; "))
}

// submit publishes j until a PubAck accepts it; false if ctx ended first.
func submit(ctx context.Context, js jetstream.JetStream, j job) bool {
	for {
		msg := nats.NewMsg(protocol.SubjectSubmit)
		msg.Data = j.spec
		msg.Header.Set(protocol.HeaderJobID, j.id)
		msg.Header.Set(protocol.HeaderMsgID, j.id)
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.PublishMsg(pctx, msg)
		cancel()
		if err == nil {
			return true
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return false
		}
	}
}

// attempt runs the probe on its last job: false if ctx ended. A cut that
// came too late leaves takenBack empty and notes it in tooLate.
func (pr *probe) attempt(ctx context.Context, store *jobstore.Store, tail *ledgerTail, proxies map[string]*procs.Proxy) bool {
	id := pr.id()
	pr.agent, pr.epoch, pr.rerun = "", "", ""
	deadline := time.Now().Add(pr.maxFor)
	for pr.agent == "" {
		for _, r := range tail.next() {
			if r.job == id && pr.agent == "" {
				pr.agent, pr.epoch = r.agent, r.epoch
			}
		}
		if pr.agent != "" {
			break
		}
		if time.Now().After(deadline) {
			pr.problem = fmt.Sprintf("probe job %s never started within %s", id, pr.maxFor)
			return true
		}
		if !sleepCtx(ctx, 10*time.Millisecond) {
			return false
		}
	}
	px := proxies[pr.agent]
	if !px.Blackhole() {
		pr.problem = pr.agent + " was already partitioned when it started the probe step"
		return true
	}
	pr.begun = time.Now()
	pr.cutOnce.Do(func() { close(pr.cut) })
	defer func() { px.Heal(); pr.healed = time.Now() }()
	for {
		for _, r := range tail.next() {
			if r.job == id && r.agent != pr.agent && r.epoch != pr.epoch && pr.rerun == "" {
				pr.rerun = r.agent + "@" + r.epoch
			}
		}
		in := time.Since(pr.begun)
		if pr.takenBack == "" {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			st, _, err := store.Step(rctx, id, "s")
			cancel()
			held := st != nil && st.Actor == pr.agent && strconv.FormatUint(st.Epoch, 10) == pr.epoch
			switch {
			case err != nil || (held && st.State == jobstore.StepDispatched):
			case held && st.State == jobstore.StepSucceeded:
				pr.tooLate = append(pr.tooLate, fmt.Sprintf("%s.s@%s on %s", id, pr.epoch, pr.agent))
				return true
			default:
				pr.takenBack, pr.tookBack = fmt.Sprintf("%s@%d on %q", st.State, st.Epoch, st.Actor), in
			}
		}
		if pr.takenBack != "" && in >= pr.minFor {
			return true
		}
		if in > pr.maxFor {
			pr.problem = fmt.Sprintf("%s was cut off for %s while it ran %s.s@%s, and the step was never taken back from it",
				pr.agent, pr.maxFor, id, pr.epoch)
			return true
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return false
		}
	}
}

// note records, on the chaos goroutine, the process of the probe's agent
// once the probe is done: the one that ran the step, unless it was killed
// and restarted after the heal.
func (p *partitioner) note() {
	if pr := p.probe; pr.victim == nil && pr.finished() && pr.agent != "" {
		pr.victim = p.c.roles[pr.agent].proc
	}
}

// check says what became of the probe, once the cluster settled: the step
// was taken back during the partition (run checked that), the agent's own
// dispatch did not win, and its late report was dropped as stale, unless
// it gave the lease up and reported nothing.
func (pr *probe) check(final map[string]*jobstore.Step, stale []protocol.Event) (story string, problems []string) {
	if pr.problem != "" {
		return "probe failed", []string{"probe: " + pr.problem}
	}
	if pr.agent == "" {
		return "probe never ran", []string{"probe: never started"}
	}
	id := pr.id()
	key := id + ".s"
	story = fmt.Sprintf("probe: %s blackholed for %s while it ran %s@%s; taken back after %s (%s)",
		pr.agent, pr.healed.Sub(pr.begun).Round(time.Millisecond), key, pr.epoch, pr.tookBack.Round(time.Millisecond), pr.takenBack)
	if pr.rerun != "" {
		story += ", run again on " + pr.rerun + " before the heal"
	}
	if len(pr.tooLate) > 0 {
		story += fmt.Sprintf(" (cut off too late before: %s)", strings.Join(pr.tooLate, "; "))
	}
	if st := final[key]; st == nil {
		problems = append(problems, "probe: no final record of "+key)
	} else if st.Actor == pr.agent && strconv.FormatUint(st.Epoch, 10) == pr.epoch {
		problems = append(problems, fmt.Sprintf("probe: %s succeeded with the dispatch %s@%s that was taken back while it was cut off",
			key, pr.agent, pr.epoch))
	} else {
		story += fmt.Sprintf("; won by %s@%d", st.Actor, st.Epoch)
	}
	for _, e := range stale {
		if e.JobID == id && e.Agent == pr.agent && e.Data["result_epoch"] == pr.epoch {
			return story + "; its late result was dropped: " + e.Reason, problems
		}
	}
	said := func(msg string) bool {
		for _, line := range strings.Split(pr.victim.Output(), "\n") {
			if strings.Contains(line, `"`+id+`"`) && strings.Contains(line, msg) {
				return true
			}
		}
		return false
	}
	switch {
	case pr.victim == nil:
		problems = append(problems, "probe: the agent's process was never noted")
	case said("lease lost"):
		story += "; it gave the lease up and reported nothing"
	case said("task reported"):
		problems = append(problems, fmt.Sprintf("probe: %s reported %s@%s after the partition, but no stale_result event says it was dropped", pr.agent, key, pr.epoch))
	case !pr.victim.Running():
		story += "; it was killed after the heal before it reported"
	default:
		problems = append(problems, fmt.Sprintf("probe: %s neither reported %s@%s late nor gave its lease up", pr.agent, key, pr.epoch))
	}
	return story, problems
}

package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/anchor"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// Sizes of the messages of one single-step job, from a Warden run: the
// submission is the bench's spec; the records and the task carry headers
// too, which the raw pipeline adds as Warden does.
const (
	rawJobRecordSize = 900 // job record with its inline step
	rawTaskSize      = 400
	rawResultSize    = 300
)

// rawJobs drives the broker with the messages one single-step Warden job
// costs, on Warden's own streams and buckets (streams.Ensure), with
// nothing else: no spec parsing, no records decoded, no selection, agents
// that answer at once. Each stage pipelines its writes and acks its input
// only after the write it caused has its PubAck, as Warden does:
//
//	submit → [scheduler] job record create → task → ack submit
//	task → [agent] result → ack task
//	result → [scheduler] job record update (terminal) → ack result
//	terminal record → [tracker] counted, as the throughput phase counts
//
// Five stored messages per job (Warden: writes_per_job). What this
// reaches with 2,000 jobs in flight is the broker's ceiling for Warden's
// protocol on this machine: Warden's jobs_per_s can approach it, not
// pass it. Paced at Warden's half load, it is what the broker alone does
// for latency at that rate.
type rawJobs struct {
	srv    *natsServer
	client jetstream.JetStream
	done   atomic.Int64
	// timed: the agents and the tracker note when each job arrived (the
	// paced run); the in-flight run leaves them out to cost what it did.
	timed               bool
	dispatched, settled sync.Map // job id → time.Time
	spec                []byte
}

// startRawJobs starts a server and the pipeline's stages on it; they stop
// when tb closes.
func (e *Env) startRawJobs(tb *runTB, timed bool) *rawJobs {
	srv := e.startServer(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	tb.Cleanup(cancel)
	_, admin := connect(tb, srv.URL, "bench-rawjob-admin")
	if err := streams.Ensure(ctx, admin, streams.Options{}); err != nil {
		tb.Fatalf("streams: %v", err)
	}
	const agents = 8
	_, sched := connect(tb, srv.URL, "bench-rawjob-scheduler")
	_, client := connect(tb, srv.URL, "bench-rawjob-client")
	_, tracker := connect(tb, srv.URL, "bench-rawjob-tracker")
	agentJS := make([]jetstream.JetStream, agents/4)
	for i := range agentJS {
		_, agentJS[i] = connect(tb, srv.URL, fmt.Sprintf("bench-rawjob-agents-%d", i))
	}
	r := &rawJobs{srv: srv, client: client, timed: timed, spec: singleStepSpec("noop", "")}
	record, taskBody, resultBody := filler(rawJobRecordSize), filler(rawTaskSize), filler(rawResultSize)
	// Each agent's task subject, computed once; jobs go round-robin.
	taskSubjects := make([]string, agents)
	for i := range taskSubjects {
		agent := fmt.Sprintf("a%d", i)
		taskSubjects[i] = protocol.TaskSubject(protocol.Shard("bench", agent, streams.DefaultTaskShards), "bench", agent)
	}
	var nextAgent atomic.Uint64

	p := newPipeline()
	tb.Cleanup(p.close)
	var revs sync.Map // job → its record's revision (the scheduler's cache)

	// Scheduler: submissions.
	submits := consumeAll(ctx, tb, sched, protocol.StreamSubmit, "rawjob-submit", protocol.SubjectSubmit+".>", func(m jetstream.Msg) {
		id := m.Headers().Get(protocol.HeaderJobID)
		kv := nats.NewMsg("$KV." + protocol.BucketJobs + "." + protocol.JobKey(id))
		kv.Header.Set("Nats-Expected-Last-Subject-Sequence", "0")
		kv.Header.Set(protocol.HeaderRecordState, "running")
		kv.Data = record
		p.then(sched, kv, func(ack *jetstream.PubAck) {
			revs.Store(id, ack.Sequence)
			task := nats.NewMsg(taskSubjects[nextAgent.Add(1)%agents])
			task.Header.Set(protocol.HeaderMsgID, protocol.TaskMsgID(id, "s", 1))
			task.Header.Set(protocol.HeaderJob, id)
			task.Data = taskBody
			p.then(sched, task, func(*jetstream.PubAck) { _ = m.Ack() })
		})
	})
	tb.Cleanup(submits.Stop)
	// Scheduler: results.
	results := consumeAll(ctx, tb, sched, protocol.StreamResults, "rawjob-results", protocol.SubjectResultPrefix+".>", func(m jetstream.Msg) {
		id := m.Headers().Get(protocol.HeaderJob)
		v, _ := revs.LoadAndDelete(id)
		rev, _ := v.(uint64)
		kv := nats.NewMsg("$KV." + protocol.BucketJobs + "." + protocol.JobKey(id))
		kv.Header.Set("Nats-Expected-Last-Subject-Sequence", strconv.FormatUint(rev, 10))
		kv.Header.Set(protocol.HeaderRecordState, "succeeded")
		kv.Data = record
		p.then(sched, kv, func(*jetstream.PubAck) { _ = m.Ack() })
	})
	tb.Cleanup(results.Stop)
	// Agents: each its own consumer on its task subject.
	for i := range agents {
		agent := fmt.Sprintf("a%d", i)
		js := agentJS[i%len(agentJS)]
		shard := protocol.Shard("bench", agent, streams.DefaultTaskShards)
		cc := consumeAll(ctx, tb, js, protocol.TaskStream(shard), "rawjob-"+agent, protocol.TaskSubject(shard, "bench", agent), func(m jetstream.Msg) {
			id := m.Headers().Get(protocol.HeaderJob)
			if r.timed {
				r.dispatched.LoadOrStore(id, time.Now())
			}
			res := nats.NewMsg(protocol.ResultSubject("bench", agent, id, "s"))
			res.Header.Set(protocol.HeaderJob, id)
			res.Data = resultBody
			p.then(js, res, func(*jetstream.PubAck) { _ = m.Ack() })
		})
		tb.Cleanup(cc.Stop)
	}
	// Tracker: terminal records, as the throughput phase's tracker sees them.
	oc, err := tracker.OrderedConsumer(ctx, "KV_"+protocol.BucketJobs, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"$KV." + protocol.BucketJobs + ".job.>"}, DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		tb.Fatalf("tracker: %v", err)
	}
	jobPrefix := "$KV." + protocol.BucketJobs + "." + protocol.JobKey("")
	tc, err := oc.Consume(func(m jetstream.Msg) {
		if m.Headers().Get(protocol.HeaderRecordState) == "succeeded" {
			if r.timed {
				r.settled.LoadOrStore(strings.TrimPrefix(m.Subject(), jobPrefix), time.Now())
			}
			r.done.Add(1)
		}
	})
	if err != nil {
		tb.Fatalf("tracker: %v", err)
	}
	tb.Cleanup(tc.Stop)
	// Anchors are part of Warden's protocol: the supervisor keeps them. A
	// paced run without them would pay the block re-creation on nearly
	// every ack that Warden no longer pays.
	names, err := streams.Anchored(streams.Options{})
	if err != nil {
		tb.Fatalf("anchored streams: %v", err)
	}
	actx, stopAnchors := context.WithCancel(ctx)
	anchored := make(chan struct{})
	go func() { defer close(anchored); _ = anchor.New(admin, names, time.Second, zerolog.Nop()).Run(actx) }()
	tb.Cleanup(func() { stopAnchors(); <-anchored })
	// Warm up: connections, consumers and the first blocks.
	for i := range 500 {
		r.submit(tb, "warm-"+strconv.Itoa(i))
	}
	r.waitDone(tb, 500)
	return r
}

// submit publishes job id's submission asynchronously.
func (r *rawJobs) submit(tb *runTB, id string) {
	if _, err := publishAsync(r.client, submission(id, r.spec)); err != nil {
		tb.Fatalf("submit: %v", err)
	}
}

// waitDone waits until n jobs have their terminal record.
func (r *rawJobs) waitDone(tb *runTB, n int64) {
	deadline := time.Now().Add(time.Minute)
	for r.done.Load() < n {
		if time.Now().After(deadline) {
			tb.Fatalf("raw job pipeline: %d of %d jobs done", r.done.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runRawJobs measures the pipeline's most jobs/s: 2,000 in flight, as
// runThroughput keeps them.
func (e *Env) runRawJobs(tb *runTB) {
	const sec = "raw JetStream"
	r := e.startRawJobs(tb, false)
	// Keep 2,000 in flight for the window, as runThroughput.
	inFlight := int64(pick(e, 2000, 1000))
	dur := pick(e, 8*time.Second, 4*time.Second)
	base := r.done.Load()
	sent := int64(0)
	window := e.measure(tb, r.srv, "raw-jobs", dur, map[string]int{"bench": os.Getpid()})
	start := time.Now()
	for time.Since(start) < dur {
		for sent-(r.done.Load()-base) < inFlight {
			r.submit(tb, "r"+strconv.Itoa(int(sent)))
			sent++
		}
		time.Sleep(200 * time.Microsecond)
	}
	el := time.Since(start)
	finished := r.done.Load() - base
	cores, _ := window()
	r.waitDone(tb, base+sent)
	rate := float64(finished) / el.Seconds()
	e.rep.Add(Figure{Section: sec, Key: "raw_job_pipeline_per_s", Label: "job-shaped pipeline (Warden's messages, no Warden)", Value: rate, Unit: "jobs/s",
		Note: fmt.Sprintf("%d in flight for %s; per job: submit, record create, task, result, record update, on Warden's streams; nats-server %.2f cores, clients %.2f", inFlight, dur, cores["server"], cores["bench"])})
	e.rep.Add(Figure{Section: sec, Key: "raw_job_pipeline_server_cpu_cores", Label: "nats-server CPU during the pipeline", Value: cores["server"], Unit: "cores"})
	if rate > 0 {
		e.rep.Add(Figure{Section: sec, Key: "raw_job_pipeline_server_ms_per_job", Label: "nats-server CPU per job, pipeline", Value: 1000 * cores["server"] / rate, Unit: "ms",
			Note: "the broker's own cost of one job's messages; the machine's cores ÷ this = the most jobs/s its broker could carry with every client free"})
	}
	e.logf("raw: job-shaped pipeline %.0f jobs/s (server %.2f cores, clients %.2f)", rate, cores["server"], cores["bench"])
}

// runRawJobsHalfLoad paces the pipeline at the rate the latency phase
// offered Warden (half of jobs_per_s), the same way, and reads the same
// latencies: what the broker alone, carrying Warden's messages on this
// machine, does at that rate. Warden's half-load p99 cannot go below it.
func (e *Env) runRawJobsHalfLoad(tb *runTB) {
	const sec = "raw JetStream"
	rate := e.halfRate
	if rate <= 0 {
		e.logf("raw-half-load: no half-load rate from the latency phase; skipped")
		e.rep.Note("raw-half-load skipped: the latency phase offered no half-load rate")
		return
	}
	r := e.startRawJobs(tb, true)
	dur := pick(e, 8*time.Second, 3*time.Second)
	total := int(rate * dur.Seconds())
	due := make(map[string]time.Time, total)
	sent := make(map[string]time.Time, total)
	base := r.done.Load()
	window := e.measure(tb, r.srv, "raw-halfload", dur, map[string]int{"bench": os.Getpid()})
	pace(rate, total, func(i int, at time.Time) {
		id := "h" + strconv.Itoa(i)
		due[id] = at
		sent[id] = time.Now()
		r.submit(tb, id)
	})
	cores, busy := window()
	r.waitDone(tb, base+int64(total))
	// Timed from when each job was due, as the latency phase times Warden.
	load := func(m *sync.Map) func(string) (time.Time, bool) {
		return func(id string) (time.Time, bool) {
			v, ok := m.Load(id)
			if !ok {
				return time.Time{}, false
			}
			return v.(time.Time), true
		}
	}
	lat := halfLatencies(due, sent, load(&r.dispatched), load(&r.settled))
	if lat.missingDisp+lat.missingComp > 0 {
		tb.Fatalf("raw half load: %d jobs have no dispatch time and %d no terminal time", lat.missingDisp, lat.missingComp)
	}
	disp, comp := lat.disp, lat.comp
	e.rep.Add(Figure{Section: sec, Key: "raw_job_pipeline_half_dispatch_p99_ms", Label: "pipeline submit→dispatch p99 at Warden's half load", Value: ms(percentile(disp, 99)), Unit: "ms",
		Note: fmt.Sprintf("%.0f jobs/s offered for %s, paced and timed from each job's due time as the latency phase does Warden; p50 %.2f ms; from the actual send p99 %.2f ms; machine busy %.0f%%, cores: server %.2f, clients %.2f",
			rate, dur, ms(percentile(disp, 50)), ms(percentile(lat.dispSent, 99)), 100*busy, cores["server"], cores["bench"])})
	e.rep.Add(Figure{Section: sec, Key: "raw_job_pipeline_half_dispatch_from_send_p99_ms", Label: "pipeline send→dispatch p99 at Warden's half load", Value: ms(percentile(lat.dispSent, 99)), Unit: "ms",
		Note: fmt.Sprintf("timed from the actual send; send lateness p99 %.2f ms", ms(percentile(lat.lag, 99)))})
	e.rep.Add(Figure{Section: sec, Key: "raw_job_pipeline_half_dispatch_p50_ms", Label: "pipeline submit→dispatch p50 at Warden's half load", Value: ms(percentile(disp, 50)), Unit: "ms"})
	e.rep.Add(Figure{Section: sec, Key: "raw_job_pipeline_half_complete_p99_ms", Label: "pipeline submit→complete p99 at Warden's half load", Value: ms(percentile(comp, 99)), Unit: "ms"})
	e.rep.Add(Figure{Section: sec, Key: "raw_job_pipeline_half_machine_busy", Label: "machine CPU busy, pipeline at Warden's half load", Value: busy, Unit: "fraction"})
	e.logf("raw: job-shaped pipeline at %.0f jobs/s: dispatch p99 %.2f ms, p50 %.2f ms, machine busy %.0f%%", rate, ms(percentile(disp, 99)), ms(percentile(disp, 50)), 100*busy)
}

// consumeAll consumes a subject of a stream with a durable explicit-ack
// pull consumer, as Warden's scheduler and agents do.
func consumeAll(ctx context.Context, tb *runTB, js jetstream.JetStream, stream, name, filter string, h func(jetstream.Msg)) jetstream.ConsumeContext {
	c, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: name, FilterSubject: filter,
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 20000, AckWait: time.Minute})
	if err != nil {
		tb.Fatalf("consumer %s: %v", name, err)
	}
	cc, err := c.Consume(h, jetstream.PullMaxMessages(512))
	if err != nil {
		tb.Fatalf("consume %s: %v", name, err)
	}
	return cc
}

// pipeline runs a continuation when a publish's PubAck arrives, without a
// goroutine per publish: one goroutine per connection waits on its
// publishes in order (a connection's PubAcks come back in order).
type pipeline struct {
	ctx   context.Context
	stop  context.CancelFunc
	mu    sync.Mutex
	lanes map[jetstream.JetStream]chan step
	wg    sync.WaitGroup
}

type step struct {
	f    jetstream.PubAckFuture
	next func(*jetstream.PubAck)
}

func newPipeline() *pipeline {
	ctx, cancel := context.WithCancel(context.Background())
	return &pipeline{ctx: ctx, stop: cancel, lanes: map[jetstream.JetStream]chan step{}}
}

// then publishes m on js and calls next with its PubAck; a failed publish
// drops the chain (its input is redelivered after AckWait).
func (p *pipeline) then(js jetstream.JetStream, m *nats.Msg, next func(*jetstream.PubAck)) {
	if p.ctx.Err() != nil {
		return
	}
	f, err := js.PublishMsgAsync(m, jetstream.WithStallWait(stallWait))
	if err != nil {
		return
	}
	p.mu.Lock()
	lane, ok := p.lanes[js]
	if !ok {
		lane = make(chan step, 1<<16)
		p.lanes[js] = lane
		p.wg.Add(1)
		go p.wait(lane)
	}
	p.mu.Unlock()
	select {
	case lane <- step{f, next}:
	case <-p.ctx.Done():
	}
}

func (p *pipeline) wait(lane chan step) {
	defer p.wg.Done()
	for {
		select {
		case <-p.ctx.Done():
			return
		case s := <-lane:
			select {
			case ack := <-s.f.Ok():
				s.next(ack)
			case <-s.f.Err():
			case <-p.ctx.Done():
				return
			}
		}
	}
}

// close stops the waiting goroutines.
func (p *pipeline) close() {
	p.stop()
	p.wg.Wait()
}

package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

// runRawJobs drives the broker with the messages one single-step Warden
// job costs, on Warden's own streams and buckets (streams.Ensure), with
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
// pass it.
func (e *Env) runRawJobs(tb *runTB) {
	const sec = "raw JetStream"
	srv := e.startServer(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
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
	record, taskBody, resultBody := filler(rawJobRecordSize), filler(rawTaskSize), filler(rawResultSize)
	// Each agent's task subject, computed once; jobs go round-robin.
	taskSubjects := make([]string, agents)
	for i := range taskSubjects {
		agent := fmt.Sprintf("a%d", i)
		taskSubjects[i] = protocol.TaskSubject(protocol.Shard("bench", agent, streams.DefaultTaskShards), "bench", agent)
	}
	var nextAgent atomic.Uint64

	p := newPipeline()
	defer p.close()
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
	defer submits.Stop()
	// Scheduler: results.
	results := consumeAll(ctx, tb, sched, protocol.StreamResults, "rawjob-results", protocol.SubjectResultPrefix+".>", func(m jetstream.Msg) {
		id := m.Headers().Get(protocol.HeaderJob)
		rev, _ := revs.LoadAndDelete(id)
		r, _ := rev.(uint64)
		kv := nats.NewMsg("$KV." + protocol.BucketJobs + "." + protocol.JobKey(id))
		kv.Header.Set("Nats-Expected-Last-Subject-Sequence", strconv.FormatUint(r, 10))
		kv.Header.Set(protocol.HeaderRecordState, "succeeded")
		kv.Data = record
		p.then(sched, kv, func(*jetstream.PubAck) { _ = m.Ack() })
	})
	defer results.Stop()
	// Agents: each its own consumer on its task subject.
	for i := range agents {
		agent := fmt.Sprintf("a%d", i)
		js := agentJS[i%len(agentJS)]
		shard := protocol.Shard("bench", agent, streams.DefaultTaskShards)
		cc := consumeAll(ctx, tb, js, protocol.TaskStream(shard), "rawjob-"+agent, protocol.TaskSubject(shard, "bench", agent), func(m jetstream.Msg) {
			id := m.Headers().Get(protocol.HeaderJob)
			res := nats.NewMsg(protocol.ResultSubject("bench", agent, id, "s"))
			res.Header.Set(protocol.HeaderJob, id)
			res.Data = resultBody
			p.then(js, res, func(*jetstream.PubAck) { _ = m.Ack() })
		})
		defer cc.Stop()
	}
	// Tracker: terminal records, as the throughput phase's tracker sees them.
	var done atomic.Int64
	oc, err := tracker.OrderedConsumer(ctx, "KV_"+protocol.BucketJobs, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"$KV." + protocol.BucketJobs + ".job.>"}, DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		tb.Fatalf("tracker: %v", err)
	}
	tc, err := oc.Consume(func(m jetstream.Msg) {
		if m.Headers().Get(protocol.HeaderRecordState) == "succeeded" {
			done.Add(1)
		}
	})
	if err != nil {
		tb.Fatalf("tracker: %v", err)
	}
	defer tc.Stop()

	spec := singleStepSpec("noop", "")
	submit := func(i int) {
		if _, err := client.PublishMsgAsync(submission("r"+strconv.Itoa(i), spec), jetstream.WithStallWait(stallWait)); err != nil {
			tb.Fatalf("submit: %v", err)
		}
	}
	// Warm up, then keep 2,000 in flight for the window, as runThroughput.
	waitDone := func(n int64) {
		deadline := time.Now().Add(time.Minute)
		for done.Load() < n {
			if time.Now().After(deadline) {
				tb.Fatalf("raw job pipeline: %d of %d jobs done", done.Load(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	n := 0
	for ; n < 500; n++ {
		submit(n)
	}
	waitDone(int64(n))
	inFlight := int64(pick(e, 2000, 1000))
	dur := pick(e, 8*time.Second, 4*time.Second)
	base := done.Load()
	sent := int64(0)
	meter := newCPUMeter(map[string]int{"server": srv.PID(), "bench": os.Getpid()})
	stopProfiles := e.startProfiles(tb, srv, "raw-jobs", dur)
	start := time.Now()
	for time.Since(start) < dur {
		for sent-(done.Load()-base) < inFlight {
			submit(n)
			n++
			sent++
		}
		time.Sleep(200 * time.Microsecond)
	}
	el := time.Since(start)
	finished := done.Load() - base
	cores := meter.Cores()
	stopProfiles()
	waitDone(int64(n))
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

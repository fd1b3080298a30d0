package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/scheduler"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/procs"
)

// discardLogger encodes log lines at info level and throws them away, so
// the cost of logging is measured without the cost of a terminal.
func discardLogger() zerolog.Logger { return zerolog.New(io.Discard).Level(zerolog.InfoLevel) }

// startScheduler runs a scheduler in this process until the phase ends.
func startScheduler(tb *runTB, url string, cfg scheduler.Config) {
	nc, js := connect(tb, url, "bench-scheduler")
	s, err := scheduler.New(cfg, nc, scheduler.WithLogger(discardLogger()))
	if err != nil {
		tb.Fatalf("scheduler: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	tb.Cleanup(func() { cancel(); <-done })
	waitConsumer(tb, js, protocol.StreamSubmit, "scheduler-submit-bare", done) // the last consumer the scheduler creates
}

// startSupervisor runs a supervisor in this process until the phase ends.
func startSupervisor(tb *runTB, url string, cfg supervisor.Config) {
	nc, _ := connect(tb, url, "bench-supervisor")
	s, err := supervisor.New(cfg, nc, discardLogger(), nil)
	if err != nil {
		tb.Fatalf("supervisor: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	tb.Cleanup(func() { cancel(); <-done })
}

func waitConsumer(tb *runTB, js jetstream.JetStream, stream, name string, done <-chan error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.Consumer(ctx, stream, name)
		cancel()
		if err == nil {
			return
		}
		select {
		case err := <-done:
			tb.Fatalf("stopped before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("consumer %s on %s not ready: %v", name, stream, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writeConfig writes a YAML config for a process and returns its path.
func (e *Env) writeConfig(name, body string) string {
	e.serial++
	p := filepath.Join(e.work, fmt.Sprintf("%s-%d.yaml", name, e.serial))
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		panic(fatalError{err.Error()})
	}
	return p
}

// schedulerProc starts the scheduler binary with its defaults and waits
// until it runs. With a profile directory it serves pprof (profileOf).
func (e *Env) schedulerProc(tb *runTB, url string, shards int) *procs.Proc {
	body := fmt.Sprintf("task_shards: %d\nmetrics_addr: \"\"\n", shards)
	if e.cfg.ProfileDir != "" {
		body += "pprof_addr: 127.0.0.1:0\n"
	}
	cfg := e.writeConfig("scheduler", body)
	p := procs.Start(tb, "scheduler", e.bins["scheduler"], "--server", url, "--config", cfg)
	p.WaitOutput(tb, "scheduler running", 60*time.Second)
	return p
}

// supervisorProc starts the supervisor binary with its defaults (lease TTL
// 5s, failure threshold 1s) and waits until it campaigns.
func (e *Env) supervisorProc(tb *runTB, url, id string, shards int) *procs.Proc {
	body := fmt.Sprintf("task_shards: %d\nmetrics_addr: \"\"\n", shards)
	if e.cfg.ProfileDir != "" {
		body += "pprof_addr: 127.0.0.1:0\n"
	}
	cfg := e.writeConfig("supervisor", body)
	p := procs.Start(tb, id, e.bins["supervisor"], "--server", url, "--config", cfg, "--id", id)
	p.WaitOutput(tb, "supervisor campaigning", 60*time.Second)
	return p
}

// submission is a job submission per docs/protocol.md, as pkg/client
// sends it: on the job's own subject (so one scheduler partition owns the
// job), with the id chosen by the submitter.
func submission(id string, spec []byte) *nats.Msg {
	m := nats.NewMsg(protocol.SubmitSubject(id))
	m.Data = spec
	m.Header.Set(protocol.HeaderJobID, id)
	m.Header.Set(protocol.HeaderMsgID, id)
	return m
}

func singleStepSpec(action, agent string) []byte {
	st := map[string]any{"id": "s", "action": action}
	if agent != "" {
		st["agent"] = agent
	}
	b, _ := json.Marshal(map[string]any{"name": "bench", "steps": []any{st}})
	return b
}

func chainSpec(n int) []byte {
	var steps []any
	for i := 0; i < n; i++ {
		st := map[string]any{"id": fmt.Sprintf("s%d", i), "action": "noop"}
		if i > 0 {
			st["depends_on"] = []string{fmt.Sprintf("s%d", i-1)}
		}
		steps = append(steps, st)
	}
	b, _ := json.Marshal(map[string]any{"name": "chain", "steps": steps})
	return b
}

func fanoutSpec(n int) []byte { return fanoutSpecAction(n, "noop") }

func fanoutSpecAction(n int, action string) []byte {
	var steps []any
	for i := 0; i < n; i++ {
		steps = append(steps, map[string]any{"id": fmt.Sprintf("s%d", i), "action": action})
	}
	b, _ := json.Marshal(map[string]any{"name": "fanout", "steps": steps})
	return b
}

// tracker learns when jobs finish from their job.<id> records in the job
// store: a headers-only ordered consumer on the KV stream, filtered to job
// records, that reads the record's state from its Warden-State header
// (every job-store write carries it). It costs the server one small
// delivery per job-record write and adds no write.
type tracker struct {
	mu       sync.Mutex
	finished map[string]time.Time
	states   map[string]int
	waiters  map[string]chan struct{}
	count    int
	notify   chan struct{}
}

func newTracker(tb *runTB, js jetstream.JetStream) *tracker {
	t := &tracker{finished: map[string]time.Time{}, states: map[string]int{}, waiters: map[string]chan struct{}{},
		notify: make(chan struct{}, 1)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	prefix := "$KV." + protocol.BucketJobs + "."
	cons, err := js.OrderedConsumer(ctx, "KV_"+protocol.BucketJobs, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{prefix + protocol.JobKey("*")}, DeliverPolicy: jetstream.DeliverNewPolicy, HeadersOnly: true})
	if err != nil {
		tb.Fatalf("job-store consumer: %v", err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		now := time.Now()
		state := m.Headers().Get(protocol.HeaderRecordState)
		if !jobstore.JobState(state).Terminal() {
			return
		}
		id := strings.TrimPrefix(m.Subject(), prefix+protocol.JobKey(""))
		t.mu.Lock()
		if _, dup := t.finished[id]; !dup {
			t.finished[id] = now
			t.states[state]++
			t.count++
			if w := t.waiters[id]; w != nil {
				close(w)
				delete(t.waiters, id)
			}
		}
		t.mu.Unlock()
		select {
		case t.notify <- struct{}{}:
		default:
		}
	}, jetstream.PullMaxMessages(4096))
	if err != nil {
		tb.Fatalf("consume job store: %v", err)
	}
	tb.Cleanup(cc.Stop)
	return t
}

// wait returns a channel closed when job id finished.
func (t *tracker) wait(id string) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	ch := make(chan struct{})
	if _, ok := t.finished[id]; ok {
		close(ch)
		return ch
	}
	t.waiters[id] = ch
	return ch
}

func (t *tracker) Count() int { t.mu.Lock(); defer t.mu.Unlock(); return t.count }

func (t *tracker) at(id string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.finished[id]
	return v, ok
}

// waitCount waits until n jobs finished in all; false on timeout.
func (t *tracker) waitCount(n int, timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for t.Count() < n {
		select {
		case <-t.notify:
		case <-deadline.C:
			return t.Count() >= n
		}
	}
	return true
}

func (t *tracker) failures() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for s, c := range t.states {
		if s != "succeeded" {
			n += c
		}
	}
	return n
}

// streamSeqs returns the last sequence of every stream: the number of
// messages ever stored in it, whether still there or not.
func streamSeqs(tb *runTB, js jetstream.JetStream) map[string]uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := map[string]uint64{}
	l := js.ListStreams(ctx)
	for info := range l.Info() {
		out[info.Config.Name] = info.State.LastSeq
	}
	if err := l.Err(); err != nil {
		tb.Fatalf("list streams: %v", err)
	}
	return out
}

// schedulerDeliveries returns how many messages the scheduler's consumers
// on WARDEN_SUBMIT and WARDEN_RESULTS have delivered, redeliveries
// included: a job that never waits for a slot costs two (its submission
// and its result).
func schedulerDeliveries(tb *runTB, js jetstream.JetStream) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n uint64
	for _, stream := range []string{protocol.StreamSubmit, protocol.StreamResults} {
		st, err := js.Stream(ctx, stream)
		if err != nil {
			tb.Fatalf("stream %s: %v", stream, err)
		}
		l := st.ListConsumers(ctx)
		for info := range l.Info() {
			n += info.Delivered.Consumer
		}
		if err := l.Err(); err != nil {
			tb.Fatalf("list consumers of %s: %v", stream, err)
		}
	}
	return n
}

// background are the streams written per agent or per process over time,
// not per job: presence heartbeats, health assessments, leader leases.
var background = map[string]bool{"KV_" + protocol.BucketPresence: true, "KV_" + protocol.BucketHealth: true, "KV_" + protocol.BucketLeases: true, "KV_" + protocol.BucketClusterLeases: true}

// writesBetween sums the stored messages between two snapshots, leaving
// out the background streams.
func writesBetween(before, after map[string]uint64) (total uint64, by string) {
	var names []string
	for n := range after {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		if background[n] {
			continue
		}
		d := after[n] - before[n]
		if d > 0 {
			total += d
			parts = append(parts, fmt.Sprintf("%s=%d", n, d))
		}
	}
	return total, strings.Join(parts, " ")
}

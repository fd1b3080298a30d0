// Package cluster_test runs agent clusters as real agent processes
// (cmd/agent) against an embedded server: kill -9, SIGSTOP and restarts of
// members while a dispatcher sends a steady stream of cluster tasks.
package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
	"github.com/wardenhq/warden/test/procs"
)

var agentBin, schedulerBin, supervisorBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "warden-cluster-e2e")
	if err != nil {
		panic(err)
	}
	bins, err := procs.Build(dir, "agent", "scheduler", "supervisor")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin, schedulerBin, supervisorBin = bins["agent"], bins["scheduler"], bins["supervisor"]
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

const shards = streams.DefaultTaskShards

// sent is one task the dispatcher published.
type sent struct {
	job, agent, target string
	epoch              uint64 // cluster epoch
	at                 time.Time
}

// got is one result.
type got struct {
	protocol.Result
	at time.Time
}

type harness struct {
	t      *testing.T
	srv    *natstest.Server
	js     jetstream.JetStream
	store  *cluster.Store
	router *cluster.Router
	name   string

	mu      sync.Mutex
	agents  map[string]*procs.Proc
	sent    map[string]sent
	results map[string]got
	seq     int
}

// newHarness starts a server, defines the cluster and, unless a scheduler
// will run (withScheduler), collects results itself.
func newHarness(t *testing.T, d protocol.ClusterDefinition, withScheduler ...bool) *harness {
	t.Helper()
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{})
	ctx := context.Background()
	st, err := cluster.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	r, err := cluster.NewRouter(ctx, js, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go func() { _ = r.Run(rctx) }()
	h := &harness{t: t, srv: srv, js: js, store: st, router: r, name: d.Name,
		agents: map[string]*procs.Proc{}, sent: map[string]sent{}, results: map[string]got{}}
	if len(withScheduler) == 0 || !withScheduler[0] {
		h.collect(rctx)
	}
	return h
}

// start runs agent id as a process in the cluster.
func (h *harness) start(id string) *procs.Proc {
	h.t.Helper()
	p := procs.Start(h.t, id, agentBin, "--server", h.srv.URL, "--id", id, "--pool", "p", "--cluster", h.name, "--max-concurrent", "8")
	h.mu.Lock()
	h.agents[id] = p
	h.mu.Unlock()
	return p
}

func (h *harness) proc(id string) *procs.Proc {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.agents[id]
}

func (h *harness) state() protocol.ClusterState {
	st, _, _ := h.store.State(context.Background(), h.name)
	return st
}

// collect records every result.
func (h *harness) collect(ctx context.Context) {
	s, err := h.js.Stream(ctx, protocol.StreamResults)
	if err != nil {
		h.t.Fatal(err)
	}
	// Nobody else takes results here: the harness plays the scheduler.
	cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		h.t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		var r protocol.Result
		if json.Unmarshal(m.Data(), &r) != nil {
			return
		}
		h.mu.Lock()
		h.results[r.JobID] = got{Result: r, at: time.Now()}
		h.mu.Unlock()
	})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(cc.Stop)
}

// dispatch plays the scheduler: every interval it routes one task through
// the cluster (target: the next of targets, if any) and publishes it to the
// chosen member with the cluster headers.
func (h *harness) dispatch(ctx context.Context, every time.Duration, action string, params string, targets []string) {
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			target := ""
			if len(targets) > 0 {
				target = targets[i%len(targets)]
			}
			d, err := h.router.Route(h.name, target)
			if err != nil {
				continue
			}
			agent := d.Agent
			if agent == "" { // active_active: round robin over the members
				agent = d.Members[i%len(d.Members)]
			}
			h.publish(ctx, agent, d.Epoch, target, action, params)
		}
	}()
}

func (h *harness) publish(ctx context.Context, agentKey string, epoch uint64, target, action, params string) string {
	h.mu.Lock()
	h.seq++
	job := fmt.Sprintf("j%05d", h.seq)
	h.mu.Unlock()
	pool, id, _ := strings.Cut(agentKey, ".")
	task := protocol.Task{JobID: job, StepID: "s", Epoch: 1, Attempt: 1, Action: action, Params: json.RawMessage(params),
		Deadline: time.Now().Add(30 * time.Second), Token: protocol.NewLeaseToken()}
	b, _ := json.Marshal(task)
	m := nats.NewMsg(protocol.TaskSubject(protocol.Shard(pool, id, shards), pool, id))
	m.Data = b
	m.Header.Set(protocol.HeaderJob, job)
	m.Header.Set(protocol.HeaderStep, "s")
	m.Header.Set(protocol.HeaderEpoch, "1")
	m.Header.Set(protocol.HeaderAction, action)
	m.Header.Set(protocol.HeaderCluster, h.name)
	m.Header.Set(protocol.HeaderClusterEpoch, strconv.FormatUint(epoch, 10))
	if target != "" {
		m.Header.Set(protocol.HeaderTarget, target)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := h.js.PublishMsg(pctx, m); err != nil {
		return ""
	}
	h.mu.Lock()
	h.sent[job] = sent{job: job, agent: agentKey, target: target, epoch: epoch, at: time.Now()}
	h.mu.Unlock()
	return job
}

// firstSuccessAfter is when the first task sent after t0 succeeded on an
// agent other than not.
func (h *harness) firstSuccessAfter(t0 time.Time, not string) (time.Time, string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var first time.Time
	var who string
	for job, r := range h.results {
		s, ok := h.sent[job]
		if !ok || s.at.Before(t0) || r.Status != protocol.ResultSucceeded || "p."+r.Agent == not {
			continue
		}
		if first.IsZero() || r.at.Before(first) {
			first, who = r.at, r.Agent
		}
	}
	return first, who, !first.IsZero()
}

// checkFencing asserts the invariant: under one cluster epoch only one
// member completed tasks (per target, when sharded), and no agent
// completed a task it was not sent.
func (h *harness) checkFencing(perTarget bool) (completed int) {
	h.t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	owner := map[string]string{}
	for job, r := range h.results {
		if r.Status != protocol.ResultSucceeded {
			continue
		}
		s := h.sent[job]
		if "p."+r.Agent != s.agent {
			h.t.Fatalf("%s sent to %s completed by %s", job, s.agent, r.Agent)
		}
		k := strconv.FormatUint(s.epoch, 10)
		if perTarget {
			k += "/" + s.target
		}
		if o, ok := owner[k]; ok && o != r.Agent {
			h.t.Fatalf("epoch %s: tasks completed by both %s and %s", k, o, r.Agent)
		}
		owner[k] = r.Agent
		completed++
	}
	return completed
}

func (h *harness) count(status string) (n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.results {
		if r.Status == status {
			n++
		}
	}
	return n
}

func (h *harness) report(id string) (protocol.ClusterMemberReport, bool) {
	rs, _ := h.store.Reports(context.Background(), h.name)
	for _, r := range rs {
		if r.ID == id {
			return r, true
		}
	}
	return protocol.ClusterMemberReport{}, false
}

func roleOf(st protocol.ClusterState, id string) string {
	m, _ := st.Member("p." + id)
	return m.Role
}

// Package operate runs Warden's real processes (scheduler, supervisor,
// agents and `warden api`) and checks the operator surface end to end: the
// micro services, the dashboard in a headless browser, and every process's
// /metrics after a run with a failover and a dead letter.
package operate

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
	"github.com/wardenhq/warden/test/procs"
)

var bins map[string]string

func TestMain(m *testing.M) {
	procs.Main(m, &bins, "scheduler", "supervisor", "agent", "warden", "./test/testagent")
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

type env struct {
	url     string // nats
	nc      *nats.Conn
	api     string // http://host:port
	metrics map[string]string
	ledger  string
}

func (e *env) get(t *testing.T, path string, v any) int {
	t.Helper()
	res, err := http.Get(e.api + path)
	if err != nil {
		return 0 // not up yet: callers wait on the status
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if v != nil && res.StatusCode == 200 {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, b)
		}
	}
	return res.StatusCode
}

func (e *env) post(t *testing.T, path, body string, v any) int {
	t.Helper()
	res, err := http.Post(e.api+path, "application/yaml", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if v != nil {
		_ = json.Unmarshal(b, v)
	}
	if res.StatusCode >= 300 {
		t.Logf("POST %s: %d %s", path, res.StatusCode, b)
	}
	return res.StatusCode
}

// start runs NATS, a scheduler, a supervisor, `warden api` (anonymous
// admin: a loopback test), two test agents restarted when a poison task
// kills them, and a built-in agent that is a member of cluster ops.
func start(t *testing.T) *env {
	srv, nc, js := natstest.Start(t, streams.Options{})
	e := &env{url: srv.URL, nc: nc, metrics: map[string]string{}, ledger: filepath.Join(t.TempDir(), "ledger")}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := cluster.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Create(ctx, protocol.ClusterDefinition{Name: "ops", Mode: protocol.ModeActivePassive,
		Membership: protocol.ClusterMembership{Minimum: 1, Desired: 1}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"scheduler", "supervisor"} {
		e.metrics[p] = freeAddr(t)
		procs.Start(t, p, bins[p], "--server", srv.URL, "--metrics-addr", e.metrics[p])
	}
	e.metrics["agent"] = freeAddr(t)
	procs.Start(t, "agent c1", bins["agent"], "--server", srv.URL, "--id", "c1", "--cluster", "ops", "--metrics-addr", e.metrics["agent"])
	e.metrics["api"] = freeAddr(t)
	e.api = "http://" + e.metrics["api"]
	procs.Start(t, "warden api", bins["warden"], "api", "--server", srv.URL, "--listen", e.metrics["api"], "--anonymous-scope", "admin")

	agents := map[string]*procs.Proc{}
	testAgent := func(tb testing.TB, id string) *procs.Proc {
		return procs.Start(tb, id, bins["testagent"], "--server", srv.URL, "--id", id, "--pool", "default", "--capabilities", "x", "--ledger", e.ledger)
	}
	for _, id := range []string{"p1", "p2"} {
		agents[id] = testAgent(t, id)
	}
	procs.RestartExited(t, agents, testAgent) // like systemd: restart what the poison kills
	natstest.Eventually(t, 30*time.Second, "the API serves and three agents are present", func() bool {
		var as []map[string]any
		return e.get(t, "/api/v1/agents", &as) == 200 && len(as) >= 3
	})
	return e
}

// TestOperate: a poison job is dead-lettered, an agent killed while it
// holds a task is failed over; the micro services are listed; the
// dashboard shows the job, its retry chain and the dead letter, whose
// retry from the UI makes the step succeed; every process's /metrics
// then has the seed metrics.
func TestOperate(t *testing.T) {
	e := start(t)

	t.Run("micro", func(t *testing.T) { microServices(t, e) })

	// A failing job, submitted through the API: its first step kills every
	// agent that runs it until an operator fixes it (<ledger>.fixed).
	var rc struct {
		JobID string `json:"job_id"`
	}
	if st := e.post(t, "/api/v1/jobs", "name: poison\nsteps:\n- {id: f, action: flaky, requires: [x], params: {fail_attempts: 1}}\n- {id: s, action: crash, requires: [x], depends_on: [f]}\n- {id: then, action: ledger, depends_on: [s]}\n", &rc); st != 201 {
		t.Fatalf("submit: %d", st)
	}
	natstest.Eventually(t, 120*time.Second, "the poison step is dead-lettered", func() bool {
		var ls []map[string]any
		return e.get(t, "/api/v1/queues/dead-letters", &ls) == 200 && len(ls) == 1
	})

	// A failover: an agent holding a task is killed and not restarted.
	victim := procs.Start(t, "victim", bins["testagent"], "--server", e.url, "--id", "victim", "--pool", "default",
		"--capabilities", "y", "--ledger", e.ledger+".victim")
	if st := e.post(t, "/api/v1/jobs", "name: held\nsteps:\n- {id: w, action: ledger, requires: [y], params: {duration: 60s}}\n", nil); st != 201 {
		t.Fatalf("submit held: %d", st)
	}
	natstest.Eventually(t, 30*time.Second, "the victim runs its task", func() bool {
		b, _ := os.ReadFile(e.ledger + ".victim")
		return len(b) > 0
	})
	victim.Kill()
	natstest.Eventually(t, 60*time.Second, "the victim is failed over", func() bool {
		var evs []protocol.Event
		if e.get(t, "/api/v1/failovers", &evs) != 200 {
			return false
		}
		for _, ev := range evs {
			if ev.Agent == "victim" {
				return true
			}
		}
		return false
	})

	// Metrics before the dead letter is retried: its depth is 1.
	t.Run("metrics", func(t *testing.T) { scrape(t, e) })

	t.Run("dashboard", func(t *testing.T) { dashboard(t, e, rc.JobID) })
	var ls []map[string]any
	if e.get(t, "/api/v1/queues/dead-letters", &ls); len(ls) > 0 {
		// The browser was not there: retry through the API instead.
		if err := os.WriteFile(e.ledger+".fixed", nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if st := e.post(t, fmt.Sprintf("/api/v1/queues/dead-letters/%v/retry", ls[0]["id"]), "", nil); st != 200 {
			t.Fatalf("retry: %d", st)
		}
	}
	natstest.Eventually(t, 60*time.Second, "the retried job succeeds", func() bool {
		var d struct {
			Job struct{ State string } `json:"job"`
		}
		return e.get(t, "/api/v1/jobs/"+rc.JobID, &d) == 200 && d.Job.State == "succeeded"
	})
}

func microServices(t *testing.T, e *env) {
	want := []string{"warden-api", "warden-scheduler", "warden-supervisor"}
	got := map[string]int{}
	subj, _ := micro.ControlSubject(micro.InfoVerb, "", "")
	natstest.Eventually(t, 30*time.Second, "the three micro services answer $SRV.INFO", func() bool {
		inbox := nats.NewInbox()
		sub, err := e.nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := e.nc.PublishRequest(subj, inbox, nil); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := sub.NextMsg(500 * time.Millisecond)
			if err != nil {
				break
			}
			var info micro.Info
			if json.Unmarshal(m.Data, &info) == nil {
				got[info.Name] = len(info.Endpoints)
			}
		}
		for _, w := range want {
			if got[w] == 0 {
				return false
			}
		}
		return true
	})
	t.Logf("services answering $SRV.INFO (nats micro ls), with their endpoint counts: %v", got)
}

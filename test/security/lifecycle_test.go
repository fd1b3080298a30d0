package security

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/creds"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/procs"
)

var (
	binsOnce sync.Once
	bins     map[string]string
	binsErr  error
)

func binaries(t *testing.T) map[string]string {
	t.Helper()
	binsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "warden-security-bin")
		if err != nil {
			binsErr = err
			return
		}
		bins, binsErr = procs.Build(dir, "scheduler", "supervisor", "agent", "warden")
	})
	if binsErr != nil {
		t.Fatal(binsErr)
	}
	return bins
}

// cli runs the warden CLI with identity's credential.
func (d *deployment) cli(t *testing.T, identity string, args ...string) (string, string, int) {
	t.Helper()
	all := append([]string{"--server", d.url, "--creds", d.credsOf(identity), "--timeout", "5s"}, args...)
	cmd := exec.Command(binaries(t)["warden"], all...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("warden %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}

// must runs the CLI and fails the test unless it exits 0.
func (d *deployment) must(t *testing.T, identity string, args ...string) string {
	t.Helper()
	out, errOut, code := d.cli(t, identity, args...)
	if code != 0 {
		t.Fatalf("warden %s as %s: exit %d\n%s%s", strings.Join(args, " "), identity, code, out, errOut)
	}
	return out
}

// run starts a Warden process with identity's credential.
func (d *deployment) run(t *testing.T, name, bin, identity string, args ...string) *procs.Proc {
	t.Helper()
	all := append([]string{"--server", d.url, "--creds", d.credsOf(identity)}, args...)
	return procs.Start(t, name, binaries(t)[bin], all...)
}

type jobView struct {
	Job struct {
		ID    string `json:"id"`
		State string `json:"state"`
	} `json:"job"`
	Steps []struct {
		ID    string `json:"id"`
		State string `json:"state"`
		Actor string `json:"actor"`
	} `json:"steps"`
}

func (d *deployment) job(t *testing.T, id string) jobView {
	t.Helper()
	var v jobView
	out := d.must(t, creds.RoleReadonly, "--json", "job", "show", id)
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("job show: %v\n%s", err, out)
	}
	return v
}

func (d *deployment) waitJob(t *testing.T, id string, timeout time.Duration, states ...string) jobView {
	t.Helper()
	var v jobView
	waitFor(t, timeout, fmt.Sprintf("job %s in %v", id, states), func() bool {
		v = d.job(t, id)
		for _, s := range states {
			if v.Job.State == s {
				return true
			}
		}
		return false
	})
	return v
}

// submit submits a spec as the publisher and returns the job id.
func (d *deployment) submit(t *testing.T, spec string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "job.json")
	if err := os.WriteFile(f, []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	var r struct {
		JobID string `json:"job_id"`
	}
	out := d.must(t, creds.RolePublisher, "--json", "submit", "-f", f)
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.JobID == "" {
		t.Fatalf("submit: %v\n%s", err, out)
	}
	return r.JobID
}

// TestLifecycleWithEachRolesCredential runs a deployment in the production
// auth configuration, every process and CLI call with its own role's
// credential, through the life cycle the CLI offers, and checks that the
// server refused nothing.
func TestLifecycleWithEachRolesCredential(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	d := start(t, pool+".a1", pool+".a2")
	binaries(t)

	// Streams by the setup identity only.
	d.must(t, creds.RoleSetup, "setup", "--task-shards", fmt.Sprint(shards))
	sched := d.run(t, "scheduler", "scheduler", creds.RoleScheduler)
	sup := d.run(t, "supervisor", "supervisor", creds.RoleSupervisor)
	a1 := d.run(t, "a1", "agent", creds.AgentIdentity(pool, "a1"), "--id", "a1", "--pool", pool, "--capabilities", "linux")
	a2 := d.run(t, "a2", "agent", creds.AgentIdentity(pool, "a2"), "--id", "a2", "--pool", pool, "--capabilities", "linux")
	all := []*procs.Proc{sched, sup, a1, a2}

	// agents ls (readonly) sees both agents, with health known.
	waitFor(t, 30*time.Second, "agents ls lists a1 and a2 with health", func() bool {
		var agents []map[string]any
		out := d.must(t, creds.RoleReadonly, "--json", "agents", "ls")
		if json.Unmarshal([]byte(out), &agents) != nil || len(agents) != 2 {
			return false
		}
		for _, a := range agents {
			if h, _ := a["health"].(map[string]any); h == nil || h["level"] == nil {
				return false
			}
		}
		return true
	})

	// Submit (publisher), dispatch, results: a job succeeds.
	ok := d.submit(t, `{"name":"ok","steps":[{"id":"a","action":"echo","params":{"message":"hi"}},{"id":"b","action":"echo","params":{"message":"b"},"depends_on":["a"]}]}`)
	d.waitJob(t, ok, 60*time.Second, "succeeded")
	d.must(t, creds.RoleReadonly, "jobs", "ls")

	// A delayed job (publisher): the scheduler holds it in WARDEN_DELAY,
	// the server releases it, a scheduler's delay relay submits it again.
	later := d.submit(t, `{"name":"later","delay":"1s","steps":[{"id":"a","action":"echo","params":{"message":"later"}}]}`)
	waitFor(t, 30*time.Second, "the delayed job is released", func() bool {
		_, _, code := d.cli(t, creds.RoleReadonly, "job", "show", later)
		return code == 0 // not found (3) until it is due
	})
	d.waitJob(t, later, 60*time.Second, "succeeded")

	// A step that fails (timeout), then `job retry` (admin).
	bad := d.submit(t, `{"name":"bad","steps":[{"id":"s","action":"sleep","params":{"duration":"5s"},"timeout":"200ms","max_retries":0}]}`)
	d.waitJob(t, bad, 60*time.Second, "failed")
	d.must(t, creds.RoleAdmin, "job", "retry", bad)
	d.waitJob(t, bad, 60*time.Second, "failed")

	// dlq ls (readonly), retry and purge (admin): a dead letter for the
	// failed step, written by the supervisor's identity.
	sv := d.connect(t, creds.RoleSupervisor)
	m := nats.NewMsg(protocol.DLQSubject(pool, "a1"))
	m.Header.Set(protocol.HeaderJob, bad)
	m.Header.Set(protocol.HeaderStep, "s")
	m.Header.Set(protocol.HeaderEpoch, "1")
	m.Header.Set(protocol.HeaderDLQReason, "max_deliveries")
	m.Data = []byte(`{}`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := sv.js.PublishMsg(ctx, m)
	if err != nil {
		t.Fatalf("dead letter: %v", err)
	}
	if out := d.must(t, creds.RoleReadonly, "dlq", "ls"); !strings.Contains(out, bad) {
		t.Fatalf("dlq ls does not list the letter:\n%s", out)
	}
	// The step failed and is not dead-lettered: its letter is refused as a
	// usage error. Parked as the supervisor parks it, it is retried.
	if _, errOut, code := d.cli(t, creds.RoleAdmin, "dlq", "retry", fmt.Sprint(ack.Sequence)); code != 2 {
		t.Fatalf("dlq retry of a letter whose step is not dead-lettered: exit %d\n%s", code, errOut)
	}
	store, err := jobstore.Open(ctx, sv.js)
	if err != nil {
		t.Fatal(err)
	}
	st, rev, err := store.Step(ctx, bad, "s")
	if err != nil {
		t.Fatal(err)
	}
	st.DeadLetter("delivered 5 times", time.Now().UTC())
	if _, err := store.UpdateStep(ctx, st, rev); err != nil {
		t.Fatalf("park the step: %v", err)
	}
	d.must(t, creds.RoleAdmin, "dlq", "retry", fmt.Sprint(ack.Sequence))
	d.waitJob(t, bad, 60*time.Second, "failed")
	if _, err := sv.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	d.must(t, creds.RoleAdmin, "dlq", "purge", "--yes")

	// Cancel reaching the agent (admin): a long step is interrupted.
	long := d.submit(t, `{"name":"long","steps":[{"id":"s","action":"sleep","params":{"duration":"60s"}}]}`)
	waitFor(t, 30*time.Second, "the long step runs", func() bool {
		v := d.job(t, long)
		return len(v.Steps) == 1 && v.Steps[0].State == "dispatched"
	})
	out := d.must(t, creds.RoleAdmin, "--json", "job", "cancel", long)
	if !strings.Contains(out, `"interrupted"`) || strings.Contains(out, `"unreached"`) {
		t.Fatalf("cancel did not reach the agent:\n%s", out)
	}
	d.waitJob(t, long, 60*time.Second, "cancelled")

	// Drain, undrain, failover (admin).
	// With --json, stdout is one JSON document (it was the human line).
	for _, args := range [][]string{{"agent", "drain", "a1"}, {"agent", "undrain", "a1"}, {"agent", "failover", "a2"}} {
		if out := d.must(t, creds.RoleAdmin, append([]string{"--json"}, args...)...); !json.Valid([]byte(out)) {
			t.Fatalf("warden --json %v printed %q", args, out)
		}
	}

	// Self-healing's orders (internal/supervisor, healing.go) are the same
	// ops calls under the supervisor's identity: they were refused
	// ("may not publish warden.control.agent.default.a1"), so healing
	// could neither limit nor drain an agent in production.
	for _, args := range [][]string{{"agent", "drain", "a1"}, {"agent", "undrain", "a1"}} {
		if out := d.must(t, creds.RoleSupervisor, append([]string{"--json"}, args...)...); !json.Valid([]byte(out)) {
			t.Fatalf("warden --json %v (as the supervisor) printed %q", args, out)
		}
	}

	// Healing history (readonly).
	d.must(t, creds.RoleReadonly, "healing", "ls")

	// NATS micro: admin discovers the services ($SRV is an operator's:
	// the library answers it on any reply subject); readonly calls their
	// read endpoints, and the admin endpoints are not within its reach.
	ro, adm := d.connect(t, creds.RoleReadonly), d.connect(t, creds.RoleAdmin)
	for _, svc := range []string{"scheduler", "supervisor"} {
		if _, err := adm.nc.Request("$SRV.PING.warden-"+svc, nil, 5*time.Second); err != nil {
			t.Fatalf("micro ping warden-%s: %v", svc, err)
		}
		for _, ep := range []string{"overview.get", "jobs.list", "agents.list", "queues.tasks", "dlq.list", "healing.actions", "healing.status", "failovers.list"} {
			m, err := ro.nc.Request("warden.ops."+svc+"."+ep, []byte(`{}`), 10*time.Second)
			if err != nil {
				t.Fatalf("micro %s %s: %v", svc, ep, err)
			}
			if code := m.Header.Get("Nats-Service-Error-Code"); code != "" {
				t.Fatalf("micro %s %s: error %s: %s", svc, ep, code, m.Data)
			}
		}
	}
	if got := ro.refusals(); len(got) != 0 {
		t.Fatalf("readonly refused: %v", got)
	}
	if got := adm.refusals(); len(got) != 0 {
		t.Fatalf("admin refused: %v", got)
	}

	// Nothing any process or command did was refused.
	d.log.none(t, "the life cycle")
	for _, p := range all {
		if strings.Contains(p.Output(), "permission denied") {
			t.Fatalf("%s logged a permission error:\n%s", p.Name, p.Output())
		}
	}

	// The read-only credential is refused, with exit 5 naming the
	// identity and the subject, never "NATS unavailable".
	_, errOut, code := d.cli(t, creds.RoleReadonly, "job", "retry", bad)
	if code != 5 || !strings.Contains(errOut, `"readonly"`) || !strings.Contains(errOut, "$KV.warden_jobs") {
		t.Fatalf("readonly job retry: exit %d, %s; want exit 5 naming readonly and the subject", code, errOut)
	}
	t.Logf("readonly job retry: exit %d: %s", code, errOut)
}

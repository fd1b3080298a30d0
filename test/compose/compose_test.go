// Package compose tests docker-compose.yml, the production shape: a
// 3-node NATS cluster in operator/JWT mode with TLS, generated credentials,
// 2 schedulers, 2 supervisors, 3 agents. `make compose-test` runs it (it
// needs the images and credentials that `make images creds` make); plain
// `go test` skips it.
package compose

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

const project = "warden-compose-test"

// Host ports, away from a developer's own deployment.
var ports = map[string]string{
	"WARDEN_NATS_PORT": "14222", "WARDEN_SCHEDULER_1_PORT": "19090", "WARDEN_SCHEDULER_2_PORT": "19091",
	"WARDEN_SUPERVISOR_1_PORT": "19092", "WARDEN_SUPERVISOR_2_PORT": "19093", "WARDEN_API_PORT": "18080",
}

type env struct {
	t       *testing.T
	root    string
	secrets string
	url     string
}

func (e *env) environ() []string {
	out := append(os.Environ(), "WARDEN_SECRETS="+e.secrets, "WARDEN_NATS_SCHEME=tls")
	for k, v := range ports {
		out = append(out, k+"="+v)
	}
	return out
}

func (e *env) compose(args ...string) (string, error) {
	cmd := exec.Command("docker-compose", append([]string{"-p", project}, args...)...)
	cmd.Dir = e.root
	cmd.Env = e.environ()
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

func (e *env) mustCompose(args ...string) string {
	e.t.Helper()
	out, err := e.compose(args...)
	if err != nil {
		e.t.Fatalf("docker-compose %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// warden runs bin/warden on the host with a role's credential.
func (e *env) warden(role string, args ...string) (string, error) {
	all := append([]string{"--server", e.url, "--creds", filepath.Join(e.secrets, "creds", role+".creds"), "--timeout", "5s"}, args...)
	cmd := exec.Command(filepath.Join(e.root, "bin", "warden"), all...)
	cmd.Env = append(os.Environ(), "NATS_CA="+filepath.Join(e.secrets, "creds", "ca.pem"))
	var b, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &errb
	err := cmd.Run()
	if err != nil {
		return b.String(), fmt.Errorf("warden %s: %v: %s", strings.Join(args, " "), err, errb.String())
	}
	return b.String(), nil
}

// submit submits spec with `warden submit` as the publisher and returns
// the job id.
func (e *env) submit(t *testing.T, spec string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "job.json")
	if err := os.WriteFile(f, []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := e.warden("publisher", "--json", "submit", "-f", f)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		JobID string `json:"job_id"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("submit: %v\n%s", err, out)
	}
	return r.JobID
}

// jobState is a job's state as `warden job show` reads it ("" if unread).
func (e *env) jobState(id string) string {
	out, err := e.warden("readonly", "--json", "job", "show", id)
	var v struct {
		Job struct {
			State string `json:"state"`
		} `json:"job"`
	}
	if err != nil || json.Unmarshal([]byte(out), &v) != nil {
		return ""
	}
	return v.Job.State
}

// getJSON GETs url and decodes its JSON body into v; it returns the status.
func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	r, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer func() { _ = r.Body.Close() }()
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %d, body: %v", url, r.StatusCode, err)
	}
	return r.StatusCode
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", timeout, what)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func TestCompose(t *testing.T) {
	if os.Getenv("WARDEN_COMPOSE_TEST") == "" {
		t.Skip("run with `make compose-test` (needs Docker, docker-compose, and the images and credentials it makes)")
	}
	for _, bin := range []string{"docker", "docker-compose"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("compose test skipped: %s is not installed", bin)
		}
	}
	root, _ := filepath.Abs("../..")
	secrets := os.Getenv("WARDEN_SECRETS")
	if secrets == "" {
		secrets = ".warden/secrets"
	}
	if !filepath.IsAbs(secrets) {
		secrets = filepath.Join(root, secrets)
	}
	if _, err := os.Stat(filepath.Join(secrets, "manifest.json")); err != nil {
		t.Fatalf("no credentials in %s: run `make images creds` (make compose-test does)", secrets)
	}
	e := &env{t: t, root: root, secrets: secrets, url: "tls://127.0.0.1:" + ports["WARDEN_NATS_PORT"]}
	healthy := 2 * time.Minute
	if d, err := time.ParseDuration(os.Getenv("COMPOSE_HEALTHY")); err == nil {
		healthy = d
	}

	_, _ = e.compose("down", "-v", "--remove-orphans")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := e.compose("logs", "--no-color", "--tail", "80")
			t.Logf("--- docker-compose logs ---\n%s", out)
		}
		_ = exec.Command("docker", "rm", "-f", project+"-rogue").Run()
		_, _ = e.compose("down", "-v", "--remove-orphans")
	})

	// NATS, then setup (the only identity that may create streams), then
	// the rest.
	e.mustCompose("up", "-d", "nats-1", "nats-2", "nats-3")
	var setupErr error
	waitFor(t, 90*time.Second, "warden setup succeeds", func() bool {
		var out string
		out, setupErr = e.compose("run", "--rm", "setup")
		return setupErr == nil && strings.Contains(out, "up to date")
	})
	e.mustCompose("up", "-d")
	started := time.Now()

	// agents ls: three agents, health known, in under a second.
	var took time.Duration
	waitFor(t, 90*time.Second, "agents ls shows 3 agents with health", func() bool {
		t0 := time.Now()
		out, err := e.warden("readonly", "--json", "agents", "ls")
		took = time.Since(t0)
		var agents []map[string]any
		if err != nil || json.Unmarshal([]byte(out), &agents) != nil || len(agents) != 3 {
			return false
		}
		for _, a := range agents {
			if h, _ := a["health"].(map[string]any); h == nil || h["level"] == nil {
				return false
			}
		}
		return true
	})
	if took > time.Second {
		t.Fatalf("agents ls took %s, want under 1s", took)
	}
	t.Logf("agents ls: 3 agents with health in %s", took)

	// Jobs through it: submitted by the publisher, read by readonly.
	var ids []string
	for i := range 10 {
		spec := fmt.Sprintf(`{"name":"compose-%d","steps":[{"id":"a","action":"echo","params":{"message":"a"}},`+
			`{"id":"b","action":"sleep","params":{"duration":"100ms"},"depends_on":["a"]},`+
			`{"id":"c","action":"echo","params":{"message":"c"},"depends_on":["b"]}]}`, i)
		ids = append(ids, e.submit(t, spec))
	}
	for _, id := range ids {
		waitFor(t, 60*time.Second, "job "+id+" succeeds", func() bool { return e.jobState(id) == "succeeded" })
	}
	t.Logf("%d jobs succeeded", len(ids))

	// The HTTP API, under its own identity: ready, and it reads the jobs.
	api := "http://127.0.0.1:" + ports["WARDEN_API_PORT"]
	waitFor(t, 60*time.Second, "the API is ready", func() bool {
		r, err := http.Get(api + "/readyz")
		if err != nil {
			return false
		}
		_ = r.Body.Close()
		return r.StatusCode == http.StatusOK
	})
	var shown struct {
		Job struct {
			State string `json:"state"`
		} `json:"job"`
	}
	if code := getJSON(t, api+"/api/v1/jobs/"+ids[0], &shown); code != http.StatusOK || shown.Job.State != "succeeded" {
		t.Fatalf("GET /api/v1/jobs/%s: %d, state %q", ids[0], code, shown.Job.State)
	}
	t.Logf("API: ready, and job %s reads %s", ids[0], shown.Job.State)

	// Healthy running: no supervisor fails over an agent that is alive.
	if rest := healthy - time.Since(started); rest > 0 {
		t.Logf("running healthy for %s more", rest.Round(time.Second))
		time.Sleep(rest)
	}
	for _, p := range []string{ports["WARDEN_SUPERVISOR_1_PORT"], ports["WARDEN_SUPERVISOR_2_PORT"]} {
		n := metric(t, "http://127.0.0.1:"+p+"/metrics", `warden_failovers_total{outcome="nothing_to_move"}`)
		if n != 0 {
			t.Fatalf("supervisor on :%s: %v nothing_to_move failovers over %s of healthy running", p, n, healthy)
		}
	}
	t.Logf("nothing_to_move failovers after %s: 0 on both supervisors", time.Since(started).Round(time.Second))

	// No permission error in any log; no secret in any log.
	logs := e.mustCompose("logs", "--no-color")
	if re := regexp.MustCompile(`(?i)permissions? violation|permission denied|authorization violation`); re.MatchString(logs) {
		t.Fatalf("permission errors in the logs:\n%s", strings.Join(grep(logs, re), "\n"))
	}
	if pw, err := os.ReadFile(filepath.Join(secrets, "keys", "route.nk")); err == nil && strings.Contains(logs, strings.TrimSpace(string(pw))) {
		t.Fatal("the route password appears in the logs")
	}
	t.Logf("logs: %d lines, 0 permission errors", strings.Count(logs, "\n"))

	// A server without the route credentials cannot join the cluster.
	network := project + "_default"
	out, err := exec.Command("docker", "run", "-d", "--name", project+"-rogue", "--network", network, "--user", "65532:65532",
		"warden/nats-server:dev", "-n", "rogue", "-js", "-sd", "/data", "--cluster_name", "warden", "--cluster", "nats://0.0.0.0:6222",
		"--routes", "nats-route://nats-1:6222,nats-route://nats-2:6222").CombinedOutput()
	if err != nil {
		t.Fatalf("start a rogue server: %v\n%s", err, out)
	}
	// It keeps trying (and failing) to open routes; give it a few rounds.
	time.Sleep(8 * time.Second)
	if b, _ := exec.Command("docker", "inspect", "-f", "{{.State.Running}}", project+"-rogue").Output(); strings.TrimSpace(string(b)) != "true" {
		lg, _ := exec.Command("docker", "logs", project+"-rogue").CombinedOutput()
		t.Fatalf("the rogue server is not running, so it proves nothing:\n%s", lg)
	}
	if joined := routedServers(t, e); joined["rogue"] {
		t.Fatal("the rogue server joined the cluster")
	} else {
		t.Logf("cluster routes after the rogue tried: %v (rogue absent)", joined)
	}
	rogueLog, _ := exec.Command("docker", "logs", project+"-rogue").CombinedOutput()
	routeErrs := grep(string(rogueLog), regexp.MustCompile(`(?i)route.*(error|closed|tls|handshake)|(error|closed|tls|handshake).*route`))
	if len(routeErrs) == 0 {
		t.Fatalf("the rogue server's log shows no refused route:\n%s", rogueLog)
	}
	t.Logf("rogue server's route attempts (%d refused), e.g.:\n%s", len(routeErrs), tail(strings.Join(routeErrs, "\n"), 2))

	// No container runs as root.
	ids2 := strings.Fields(e.mustCompose("ps", "-q"))
	for _, id := range append(ids2, project+"-rogue") {
		b, err := exec.Command("docker", "inspect", "-f", "{{.Name}} {{.Config.User}} {{.State.Pid}}", id).Output()
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b))
		if len(f) < 3 || f[1] == "" || strings.HasPrefix(f[1], "0:") || f[1] == "0" || f[1] == "root" {
			t.Fatalf("container %s runs as %q", f[0], f[1])
		}
		if f[2] != "0" { // running: check the real uid of its process
			st, err := os.ReadFile("/proc/" + f[2] + "/status")
			if err == nil && regexp.MustCompile(`(?m)^Uid:\s+0\s`).Match(st) {
				t.Fatalf("container %s's process runs as uid 0", f[0])
			}
		}
	}
	t.Logf("%d containers, none as root", len(ids2)+1)

	killOneNode(t, e)
	stopAnAgentMidTask(t, e)
}

// stopAnAgentMidTask stops an agent (docker-compose stop: SIGTERM, then
// SIGKILL after the service's stop_grace_period) while it runs a 15 s
// step: the agent drains, lets the step finish, and exits 0. With Docker's
// default 10 s grace it was killed (exit 137) in the middle of the step.
func stopAnAgentMidTask(t *testing.T, e *env) {
	t.Helper()
	job := e.submit(t, `{"name":"stop-mid-task","steps":[{"id":"a","action":"sleep","agent":"agent-3","params":{"duration":"15s"}}]}`)
	waitFor(t, 30*time.Second, "the 15 s step runs on agent-3", func() bool {
		out, err := e.warden("readonly", "--json", "job", "show", job)
		return err == nil && strings.Contains(out, `"dispatched"`)
	})
	t0 := time.Now()
	e.mustCompose("stop", "agent-3")
	took := time.Since(t0)
	id := strings.TrimSpace(e.mustCompose("ps", "-q", "agent-3"))
	b, err := exec.Command("docker", "inspect", "-f", "{{.State.ExitCode}}", id).Output()
	if err != nil {
		t.Fatal(err)
	}
	if code := strings.TrimSpace(string(b)); code != "0" {
		t.Fatalf("agent-3 exited %s after %s of stopping, want 0 (drained, not killed)", code, took.Round(time.Second))
	}
	waitFor(t, 60*time.Second, "the step's job succeeds", func() bool { return e.jobState(job) == "succeeded" })
	t.Logf("agent-3 stopped mid-task in %s, exit 0; its job succeeded", took.Round(time.Second))
	e.mustCompose("start", "agent-3")
}

// killOneNode kills one of the three NATS servers (SIGKILL) while jobs
// keep arriving, starts it again, and checks what issue 15 promises: no
// live agent is failed over, every job submitted meanwhile succeeds, and
// none waits longer than a step's lease (30 s: dispatch_grace). It reports
// the slowest job, which is the stall the loss of a node causes.
func killOneNode(t *testing.T, e *env) {
	t.Helper()
	failovers := func() float64 {
		var n float64
		for _, p := range []string{ports["WARDEN_SUPERVISOR_1_PORT"], ports["WARDEN_SUPERVISOR_2_PORT"]} {
			n += metricSum(t, "http://127.0.0.1:"+p+"/metrics", "warden_failovers_total")
		}
		return n
	}
	before := failovers()
	nc, err := nats.Connect(e.url, nats.UserCredentials(filepath.Join(e.secrets, "creds", "publisher.creds")),
		nats.RootCAs(filepath.Join(e.secrets, "creds", "ca.pem")), nats.CustomInboxPrefix("_INBOX.publisher"),
		nats.MaxReconnects(-1))
	if err != nil {
		t.Fatalf("connect as publisher: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	var longestSubmit time.Duration
	submit := func(i int) {
		t0 := time.Now()
		defer func() { longestSubmit = max(longestSubmit, time.Since(t0)) }()
		id := fmt.Sprintf("kill-node-%03d", i)
		m := nats.NewMsg(protocol.SubmitSubject(id))
		m.Header.Set(protocol.HeaderJobID, id)
		m.Data = []byte(`{"name":"kill-node","steps":[{"id":"a","action":"sleep","params":{"duration":"50ms"}}]}`)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		// A publish may fail while the cluster re-elects a stream leader;
		// retrying with the same job id makes at most one job.
		for {
			if _, err := js.PublishMsg(ctx, m); err == nil {
				ids = append(ids, id)
				return
			} else if ctx.Err() != nil {
				t.Fatalf("submit %s: %v", id, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// Jobs before, during and after: one every 200 ms for 30 s; nats-2
	// is killed after 5 s and started again after 15 s.
	start := time.Now()
	killed, restarted := false, false
	for i := 0; time.Since(start) < 30*time.Second; i++ {
		if !killed && time.Since(start) > 5*time.Second {
			e.mustCompose("kill", "nats-2")
			killed = true
			t.Logf("nats-2 killed at +%s", time.Since(start).Round(time.Millisecond))
		}
		if !restarted && time.Since(start) > 15*time.Second {
			e.mustCompose("start", "nats-2")
			restarted = true
			t.Logf("nats-2 started again at +%s", time.Since(start).Round(time.Millisecond))
		}
		submit(i)
		time.Sleep(200 * time.Millisecond)
	}
	var slowest time.Duration
	var slowestID string
	for _, id := range ids {
		var took time.Duration
		waitFor(t, 60*time.Second, "job "+id+" succeeds", func() bool {
			out, err := e.warden("readonly", "--json", "job", "show", id)
			var v struct {
				Job struct {
					State     string    `json:"state"`
					CreatedAt time.Time `json:"created_at"`
					UpdatedAt time.Time `json:"updated_at"`
				} `json:"job"`
			}
			if err != nil || json.Unmarshal([]byte(out), &v) != nil || v.Job.State != "succeeded" {
				return false
			}
			took = v.Job.UpdatedAt.Sub(v.Job.CreatedAt)
			return true
		})
		if took > slowest {
			slowest, slowestID = took, id
		}
	}
	if slowest > 30*time.Second {
		t.Fatalf("job %s took %s from acceptance to success, longer than a step's lease", slowestID, slowest)
	}
	if d := failovers() - before; d != 0 {
		t.Fatalf("%v failovers while one NATS node was down: every agent was alive", d)
	}
	t.Logf("one NATS node killed for 10 s under load: %d jobs all succeeded, 0 failovers, slowest job %s (%s) from acceptance to success, longest submission (with retries) %s",
		len(ids), slowest.Round(time.Millisecond), slowestID, longestSubmit.Round(time.Millisecond))
}

// scrape reads a Prometheus endpoint's exposition lines.
func scrape(t *testing.T, url string) []string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Split(string(b), "\n")
}

// sampleValue is the value at the end of an exposition line.
func sampleValue(line string) float64 {
	f := strings.Fields(line)
	v, _ := strconv.ParseFloat(f[len(f)-1], 64)
	return v
}

// metricSum adds every sample of a metric, whatever its labels.
func metricSum(t *testing.T, url, name string) float64 {
	t.Helper()
	var sum float64
	for _, line := range scrape(t, url) {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			sum += sampleValue(line)
		}
	}
	return sum
}

// metric reads one sample, named with its labels (0 when absent).
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	for _, line := range scrape(t, url) {
		if strings.HasPrefix(line, name+" ") {
			return sampleValue(line)
		}
	}
	return 0
}

// routedServers asks every server (system account) for its routes and
// returns the names of the servers routed to.
func routedServers(t *testing.T, e *env) map[string]bool {
	t.Helper()
	nc, err := nats.Connect(e.url, nats.UserCredentials(filepath.Join(e.secrets, "creds", "sys.creds")),
		nats.RootCAs(filepath.Join(e.secrets, "creds", "ca.pem")))
	if err != nil {
		t.Fatalf("connect as sys: %v", err)
	}
	defer nc.Close()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("$SYS.REQ.SERVER.PING.ROUTEZ", inbox, nil); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for {
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			break
		}
		var r struct {
			Server struct {
				Name string `json:"name"`
			} `json:"server"`
			Data struct {
				Routes []struct {
					RemoteName string `json:"remote_name"`
				} `json:"routes"`
			} `json:"data"`
		}
		if json.Unmarshal(m.Data, &r) == nil {
			out[r.Server.Name] = true
			for _, rt := range r.Data.Routes {
				out[rt.RemoteName] = true
			}
		}
	}
	if len(out) < 3 {
		t.Fatalf("routez answered by %v, want the 3 nodes", out)
	}
	return out
}

func grep(s string, re *regexp.Regexp) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if re.MatchString(l) {
			out = append(out, l)
		}
	}
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

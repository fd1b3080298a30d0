package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
	"github.com/wardenhq/warden/streams"
)

type result struct {
	code           int
	stdout, stderr string
}

// warden runs the CLI in-process.
func warden(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, args, strings.NewReader(stdin), &out, &errb)
	return result{code, out.String(), errb.String()}
}

type env struct {
	url   string
	js    jetstream.JetStream
	store *jobstore.Store
}

func setup(t *testing.T) env {
	t.Helper()
	srv, _, js := natstest.Start(t, streams.Options{TaskShards: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := jobstore.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	return env{url: srv.URL, js: js, store: st}
}

func TestUsageErrorsExit2(t *testing.T) {
	t.Parallel()
	cases := [][]string{
		{"frobnicate"},
		{"jobs", "ls", "--bogus"},
		{"jobs", "ls", "--state", "sleeping"},
		{"jobs", "ls", "--limit", "0"},
		{"jobs", "ls", "--since", "-1h"},
		{"job", "show"},
		{"job", "show", "a", "b"},
		{"submit", "-f", "/does/not/exist.yaml"},
		{"submit", "extra-arg"},
		{"dev", "--bin-dir", "/does/not/exist"},
		// A word a group command does not know: it printed the group's
		// help and exited 0, as if it had run.
		{"job", "folow", "job-x"},
		{"dlq", "purg", "--yes"},
		{"agent", "drian", "a1"},
		// A bad cron expression is the command as called, server or not
		// (it connected first and exited 4).
		{"schedule", "add", "bad", "--cron", "0 25 * * *", "-f", "../../examples/diamond.json"},
	}
	for _, args := range cases {
		r := warden(t, "", append(args, "--server", "nats://127.0.0.1:1")...)
		if r.code != exitUsage {
			t.Errorf("warden %v: exit %d, want %d (stderr %q)", args, r.code, exitUsage, r.stderr)
		}
		if r.stderr == "" {
			t.Errorf("warden %v: nothing on stderr", args)
		}
	}
}

func TestInvalidSpecExit2WithoutServer(t *testing.T) {
	t.Parallel()
	r := warden(t, "", "submit", "-f", "../../examples/invalid-cycle.yaml", "--server", "nats://127.0.0.1:1")
	if r.code != exitUsage || !strings.Contains(r.stderr, "cycle") {
		t.Fatalf("exit %d, stderr %q; want 2 naming the cycle", r.code, r.stderr)
	}
	r = warden(t, "name: x\nsteps: [{id: a, action: echo, retries: 3}]", "submit", "--json", "--server", "nats://127.0.0.1:1")
	var e struct {
		Reason   string `json:"reason"`
		ExitCode int    `json:"exit_code"`
	}
	if err := json.Unmarshal([]byte(r.stderr), &e); err != nil || r.code != exitUsage || e.Reason != spec.ReasonUnknownField || e.ExitCode != exitUsage {
		t.Fatalf("exit %d, stderr %q (%v)", r.code, r.stderr, err)
	}
}

func TestUnreachableServerExit4(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"jobs", "ls"}, {"agents", "ls"}, {"submit", "-f", "../../examples/deploy.yaml"}} {
		r := warden(t, "", append(args, "--server", "nats://127.0.0.1:1")...)
		if r.code != exitUnavailable {
			t.Errorf("warden %v: exit %d, want %d (stderr %q)", args, r.code, exitUnavailable, r.stderr)
		}
	}
}

func TestJobShowNotFoundExit3(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := warden(t, "", "job", "show", "job-nope", "--server", e.url)
	if r.code != exitNotFound || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

// materialise writes a job's records as the scheduler would and returns a
// function that ends the job in state.
func materialise(t *testing.T, e env, id, specText string) func(jobstore.JobState) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sp, err := spec.Parse([]byte(specText), spec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	steps, err := jobstore.NewSteps(id, *sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if _, err := e.store.CreateStep(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.store.CreateJob(ctx, jobstore.NewJob(id, *sp, now)); err != nil {
		t.Fatal(err)
	}
	return func(state jobstore.JobState) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stepState := jobstore.StepSucceeded
		if state != jobstore.JobSucceeded {
			stepState = jobstore.StepFailed
		}
		for _, s := range steps {
			st, rev, err := e.store.Step(ctx, id, s.ID)
			if err != nil {
				t.Error(err)
				return
			}
			if err := st.Dispatch("agent-1", "", time.Now(), time.Second); err != nil {
				t.Error(err)
				return
			}
			if rev, err = e.store.UpdateStep(ctx, st, rev); err != nil {
				t.Error(err)
				return
			}
			st.State, st.LastError = stepState, map[bool]string{true: "", false: "exit status 1"}[stepState == jobstore.StepSucceeded]
			if _, err := e.store.UpdateStep(ctx, st, rev); err != nil {
				t.Error(err)
				return
			}
		}
		j, rev, err := e.store.Job(ctx, id)
		if err != nil {
			t.Error(err)
			return
		}
		j.State, j.FinishedAt = state, time.Now()
		if _, err := e.store.UpdateJob(ctx, j, rev); err != nil {
			t.Error(err)
		}
	}
}

const keyed = "name: web\nidempotency_key: %s\nsteps:\n- {id: a, action: echo}\n- {id: b, action: echo, depends_on: [a]}\n"

func TestSubmitWaitExitCodes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		state jobstore.JobState
		code  int
	}{{jobstore.JobSucceeded, exitOK}, {jobstore.JobFailed, exitJobFailed}} {
		t.Run(string(c.state), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			key := "k-" + string(c.state)
			specText := strings.Replace(keyed, "%s", key, 1)
			id := protocol.JobIDForKey(key)
			done := make(chan result, 1)
			// No scheduler runs: the CLI warns after --timeout and then
			// follows the job, which this test plays the scheduler for.
			go func() { done <- warden(t, specText, "submit", "--wait", "--timeout", "100ms", "--server", e.url) }()
			waitForSubmission(t, e.js)
			finish := materialise(t, e, id, specText)
			finish(c.state)
			r := <-done
			if r.code != c.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, c.code, r.stdout, r.stderr)
			}
			if !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "job  "+id+" "+string(c.state)) {
				t.Fatalf("stdout lacks the job's end:\n%s", r.stdout)
			}
			if !strings.Contains(r.stdout, "step b") || !strings.Contains(r.stdout, "agent agent-1  epoch 1") {
				t.Fatalf("stdout lacks step transitions:\n%s", r.stdout)
			}
		})
	}
}

func waitForSubmission(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	natstest.Eventually(t, 10*time.Second, "submission stored", func() bool {
		s, err := js.Stream(context.Background(), protocol.StreamSubmit)
		if err != nil {
			return false
		}
		info, err := s.Info(context.Background())
		return err == nil && info.State.Msgs == 1
	})
}

func TestSubmitJSONTwiceIsExisting(t *testing.T) {
	t.Parallel()
	e := setup(t)
	specText := strings.Replace(keyed, "%s", "again", 1)
	var receipts []client.Receipt
	for i := 0; i < 2; i++ {
		r := warden(t, specText, "submit", "-f", "-", "--json", "--timeout", "100ms", "--server", e.url)
		if r.code != exitOK {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		var rc client.Receipt
		if err := json.Unmarshal([]byte(r.stdout), &rc); err != nil {
			t.Fatalf("stdout %q: %v", r.stdout, err)
		}
		receipts = append(receipts, rc)
	}
	if receipts[0].JobID != protocol.JobIDForKey("again") || receipts[1].JobID != receipts[0].JobID || receipts[0].Existing || !receipts[1].Existing {
		t.Fatalf("receipts %+v", receipts)
	}
}

func TestInspectCommands(t *testing.T) {
	t.Parallel()
	e := setup(t)
	materialise(t, e, "job-one", strings.Replace(keyed, "%s", "one", 1))(jobstore.JobSucceeded)
	materialise(t, e, "job-two", strings.Replace(keyed, "%s", "two", 1))

	r := warden(t, "", "jobs", "ls", "--server", e.url)
	if r.code != 0 || !strings.Contains(r.stdout, "job-one") || !strings.Contains(r.stdout, "2/2") || strings.Index(r.stdout, "job-two") > strings.Index(r.stdout, "job-one") {
		t.Fatalf("jobs ls (exit %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = warden(t, "", "jobs", "ls", "--state", "pending", "--json", "--server", e.url)
	var page ops.JobsPage
	if err := json.Unmarshal([]byte(r.stdout), &page); err != nil || len(page.Jobs) != 1 || page.Jobs[0].ID != "job-two" || page.Matched != 1 {
		t.Fatalf("jobs ls --json: %v %s", err, r.stdout)
	}
	r = warden(t, "", "jobs", "ls", "--limit", "1", "--server", e.url)
	if r.code != 0 || !strings.Contains(r.stdout, "job-two") || strings.Contains(r.stdout, "job-one") || !strings.Contains(r.stderr, "next page: --page ") {
		t.Fatalf("jobs ls --limit 1 (exit %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	cursor := strings.TrimSpace(r.stderr[strings.Index(r.stderr, "--page ")+len("--page "):])
	r = warden(t, "", "jobs", "ls", "--limit", "1", "--page", cursor, "--server", e.url)
	if r.code != 0 || !strings.Contains(r.stdout, "job-one") || strings.Contains(r.stdout, "job-two") || strings.Contains(r.stderr, "next page") {
		t.Fatalf("jobs ls second page (exit %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = warden(t, "", "jobs", "ls", "--state", "running,failed", "--since", "1h", "--server", e.url)
	if r.code != 0 || strings.Contains(r.stdout, "job-") {
		t.Fatalf("jobs ls --state running,failed (exit %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = warden(t, "", "jobs", "ls", "--page", "garbage!", "--server", e.url)
	if r.code != exitUsage {
		t.Fatalf("jobs ls --page garbage: exit %d, want %d: %s", r.code, exitUsage, r.stderr)
	}

	r = warden(t, "", "job", "show", "job-one", "--server", e.url)
	for _, want := range []string{"job-one", "succeeded", "agent-1", "Attempts:"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("job show lacks %q:\n%s", want, r.stdout)
		}
	}
	r = warden(t, "", "job", "show", "job-one", "--json", "--server", e.url)
	var d client.JobDetail
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || len(d.Steps) != 2 || d.Steps[0].Epoch != 1 {
		t.Fatalf("job show --json: %v %s", err, r.stdout)
	}

	r = warden(t, "", "agents", "ls", "--json", "--server", e.url)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("agents ls --json: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}

func TestWrongStateExitsUsage(t *testing.T) {
	t.Parallel()
	if got := exitCode(fmt.Errorf("wrapped: %w", ops.ErrFinished)); got != exitUsage {
		t.Fatalf("cancel of a finished job exits %d, want %d", got, exitUsage)
	}
}

func TestNotFoundErrorsExit3(t *testing.T) {
	t.Parallel()
	for _, err := range []error{jobstore.ErrNotFound, dlq.ErrNotFound, client.ErrNotFound} {
		if got := exitCode(fmt.Errorf("wrapped: %w", err)); got != exitNotFound {
			t.Errorf("%v exits %d, want %d", err, got, exitNotFound)
		}
	}
}

// The creds commands touch no server: their failures are the command as
// called (2) or an identity not in the manifest (3), never "NATS
// unavailable" (4). With --json the error's code agrees with the exit
// code (it said "internal" beside exit 3).
func TestOfflineErrorsHaveTheirOwnExitCodes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if r := warden(t, "", "creds", "init", "--dir", dir); r.code != exitOK {
		t.Fatalf("creds init: %d %s", r.code, r.stderr)
	}
	for _, c := range []struct {
		args []string
		code int
		json string
	}{
		{[]string{"creds", "revoke", "agent.default.nope", "--dir", dir}, exitNotFound, "not_found"},
		{[]string{"creds", "rotate", "bogusrole", "--dir", dir}, exitUsage, "invalid_argument"},
		{[]string{"creds", "agent", "--dir", dir}, exitUsage, "invalid_argument"},
	} {
		r := warden(t, "", append([]string{"--json"}, c.args...)...)
		var e struct {
			Code     string `json:"code"`
			ExitCode int    `json:"exit_code"`
		}
		if err := json.Unmarshal([]byte(r.stderr), &e); r.code != c.code || err != nil || e.Code != c.json || e.ExitCode != c.code {
			t.Errorf("warden %v: exit %d, stderr %s; want exit %d, code %s", c.args, r.code, r.stderr, c.code, c.json)
		}
	}
}

// submit --wait of a job that starts in an hour said "waiting for a
// scheduler to take the job..." and, once --wait-timeout ran out, only
// "context deadline exceeded". It says when the job starts, then that the
// job is still pending and how to follow it; the exit code stays 4.
func TestSubmitWaitTimeoutOfADelayedJob(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const specText = "name: later\nidempotency_key: later-1\ndelay: 1h\nsteps:\n- {id: a, action: echo}\n"
	id := protocol.JobIDForKey("later-1")
	// No scheduler runs: the submission is unconfirmed after --timeout and
	// no job record is made, so the wait can only end at --wait-timeout.
	r := warden(t, specText, "submit", "--wait", "--timeout", "100ms", "--wait-timeout", "300ms", "--server", e.url)
	if r.code != exitUnavailable {
		t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, exitUnavailable, r.stdout, r.stderr)
	}
	want := "warden: job " + id + " is still pending (delayed: starts "
	if !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "after --wait-timeout 300ms") ||
		!strings.Contains(r.stderr, "`warden job show "+id+"`") || strings.Contains(r.stderr, "context deadline exceeded") {
		t.Fatalf("stderr:\n%s\nwant the job's state (%q) and how to follow it", r.stderr, want)
	}
	if !strings.Contains(r.stdout, "job is delayed: starts ") || strings.Contains(r.stdout, "waiting for a scheduler") {
		t.Fatalf("stdout does not say when the job starts:\n%s", r.stdout)
	}

	r = warden(t, specText, "submit", "--wait", "--json", "--timeout", "100ms", "--wait-timeout", "300ms", "--server", e.url)
	var out struct {
		Error    string `json:"error"`
		Code     string `json:"code"`
		ExitCode int    `json:"exit_code"`
	}
	if err := json.Unmarshal([]byte(r.stderr[max(strings.Index(r.stderr, "{"), 0):]), &out); err != nil {
		t.Fatalf("stderr does not end in JSON: %v\n%s", err, r.stderr)
	}
	if r.code != exitUnavailable || out.ExitCode != exitUnavailable || out.Code != string(ops.CodeTimeout) || !strings.Contains(out.Error, "is still pending") {
		t.Fatalf("--json: exit %d, error %+v", r.code, out)
	}
}

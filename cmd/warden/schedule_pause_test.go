package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// scheduleEnv is a server with the schedules stream (a scheduler or
// `warden setup` creates it) and one schedule, nightly.
func scheduleEnv(t *testing.T) env {
	t.Helper()
	e := setup(t)
	if err := streams.EnsureWorkflow(context.Background(), e.js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	spec := "name: report\nsteps: [{id: a, action: echo}]\n"
	if r := warden(t, spec, "schedule", "add", "nightly", "--cron", "0 3 * * *", "--server", e.url); r.code != exitOK {
		t.Fatalf("add: exit %d %q", r.code, r.stderr)
	}
	return e
}

type lsEntry struct {
	Name        string    `json:"name"`
	Paused      bool      `json:"paused"`
	PauseReason string    `json:"pause_reason"`
	PausedAt    time.Time `json:"paused_at"`
	Next        time.Time `json:"next"`
}

func lsJSON(t *testing.T, url string) map[string]lsEntry {
	t.Helper()
	r := warden(t, "", "schedule", "ls", "--json", "--server", url)
	var list []lsEntry
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || r.code != exitOK {
		t.Fatalf("ls --json: exit %d, %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	out := map[string]lsEntry{}
	for _, e := range list {
		out[e.Name] = e
	}
	return out
}

func TestSchedulePauseResume(t *testing.T) {
	t.Parallel()
	e := scheduleEnv(t)
	r := warden(t, "", "schedule", "pause", "nightly", "--reason", "deploy freeze", "--server", e.url)
	if r.code != exitOK || !strings.Contains(r.stdout, "schedule nightly paused") {
		t.Fatalf("pause: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	r = warden(t, "", "schedule", "ls", "--server", e.url)
	if r.code != exitOK || !regexp.MustCompile(`(?m)^nightly .*paused .*ago: deploy freeze$`).MatchString(r.stdout) {
		t.Fatalf("ls does not show the pause: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	t.Logf("warden schedule ls:\n%s", r.stdout)
	if s := lsJSON(t, e.url)["nightly"]; !s.Paused || s.PauseReason != "deploy freeze" || time.Since(s.PausedAt) > time.Minute {
		t.Fatalf("ls --json: %+v", s)
	}
	r = warden(t, "", "schedule", "pause", "nightly", "--reason", "another", "--server", e.url)
	if r.code != exitOK || !strings.Contains(r.stdout, "already paused") || !strings.Contains(r.stdout, "deploy freeze") {
		t.Fatalf("pause again: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}

	// Replacing it keeps the pause, and says so.
	spec := "name: report\nsteps: [{id: a, action: echo}]\n"
	r = warden(t, spec, "schedule", "add", "nightly", "--cron", "0 4 * * *", "--replace", "--server", e.url)
	if r.code != exitOK || !strings.Contains(r.stdout, "stays paused") {
		t.Fatalf("add --replace of a paused schedule: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}

	r = warden(t, "", "schedule", "resume", "nightly", "--server", e.url)
	if r.code != exitOK || !strings.Contains(r.stdout, "schedule nightly resumed; next tick") {
		t.Fatalf("resume: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	s := lsJSON(t, e.url)["nightly"]
	if s.Paused || s.PauseReason != "" || s.Next.Hour() != 4 {
		t.Fatalf("after resume: %+v", s)
	}
	if r := warden(t, "", "schedule", "ls", "--server", e.url); strings.Contains(r.stdout, "paused ") {
		t.Fatalf("ls after resume still shows a pause:\n%s", r.stdout)
	}
	r = warden(t, "", "schedule", "resume", "nightly", "--json", "--server", e.url)
	var out struct {
		Next    time.Time `json:"next"`
		Changed bool      `json:"changed"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != exitOK || out.Changed || !out.Next.Equal(s.Next) {
		t.Fatalf("resume of a running schedule: exit %d, %q (%v)", r.code, r.stdout, err)
	}
}

func TestScheduleTrigger(t *testing.T) {
	t.Parallel()
	e := scheduleEnv(t)
	// Triggered while paused: it runs once and stays paused.
	if r := warden(t, "", "schedule", "pause", "nightly", "--server", e.url); r.code != exitOK {
		t.Fatalf("pause: exit %d %q", r.code, r.stderr)
	}
	r := warden(t, "", "schedule", "trigger", "nightly", "--server", e.url)
	m := regexp.MustCompile(`^schedule nightly triggered: job (nightly-t\d+)\n$`).FindStringSubmatch(r.stdout)
	if r.code != exitOK || m == nil {
		t.Fatalf("trigger: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	job := m[1]
	ctx := context.Background()
	submit, err := e.js.Stream(ctx, protocol.StreamSubmit)
	if err != nil {
		t.Fatal(err)
	}
	info, err := submit.Info(ctx, jetstream.WithSubjectFilter(protocol.SubjectSubmit+".>"))
	if err != nil {
		t.Fatal(err)
	}
	var found int
	for subj, n := range info.State.Subjects {
		if strings.HasSuffix(subj, "."+job) {
			found += int(n)
		}
	}
	if found != 1 || info.State.Msgs != 1 {
		t.Fatalf("submissions after the trigger: %v; want one, of %s", info.State.Subjects, job)
	}
	if s := lsJSON(t, e.url)["nightly"]; !s.Paused {
		t.Fatalf("the trigger resumed the schedule: %+v", s)
	}
	r = warden(t, "", "schedule", "trigger", "nightly", "--json", "--server", e.url)
	var out struct {
		Name  string `json:"name"`
		JobID string `json:"job_id"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != exitOK || out.Name != "nightly" || !strings.HasPrefix(out.JobID, "nightly-t") {
		t.Fatalf("trigger --json: exit %d, %q (%v)", r.code, r.stdout, err)
	}
}

// An unknown schedule is "not found" (exit 3, not_found with --json) for
// pause, resume and trigger, as for rm.
func TestSchedulePauseResumeTriggerUnknown(t *testing.T) {
	t.Parallel()
	e := scheduleEnv(t)
	for _, args := range [][]string{
		{"schedule", "pause", "nope"},
		{"schedule", "pause", "nope", "--reason", "x"},
		{"schedule", "resume", "nope"},
		{"schedule", "trigger", "nope"},
		{"schedule", "rm", "nope"},
	} {
		r := warden(t, "", append(args, "--server", e.url)...)
		if r.code != exitNotFound || !strings.Contains(r.stderr, "schedule not found: nope") {
			t.Errorf("%v: exit %d %q, want %d", args, r.code, r.stderr, exitNotFound)
		}
		r = warden(t, "", append(args, "--json", "--server", e.url)...)
		var je struct {
			Code     string `json:"code"`
			ExitCode int    `json:"exit_code"`
		}
		if err := json.Unmarshal([]byte(r.stderr), &je); err != nil || je.Code != "not_found" || je.ExitCode != exitNotFound {
			t.Errorf("%v --json: exit %d, stderr %q (%v)", args, r.code, r.stderr, err)
		}
	}
	if s := lsJSON(t, e.url); len(s) != 1 || s["nightly"].Paused {
		t.Fatalf("schedules after the refused commands: %+v", s)
	}
}

// Wrong arguments and a reason too long are the command as called: exit
// 2, without a server.
func TestSchedulePauseResumeTriggerUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"schedule", "pause"},
		{"schedule", "pause", "a", "b"},
		{"schedule", "resume"},
		{"schedule", "trigger"},
		{"schedule", "trigger", "a", "b"},
		{"schedule", "pause", "a", "--reason", strings.Repeat("x", 1025)},
	} {
		if r := warden(t, "", append(args, "--server", "nats://127.0.0.1:1")...); r.code != exitUsage {
			t.Errorf("%v: exit %d %q, want %d", args[:min(len(args), 3)], r.code, r.stderr, exitUsage)
		}
	}
}

package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestScheduleAddLsRm(t *testing.T) {
	t.Parallel()
	e := setup(t)
	spec := "name: report\nsteps: [{id: a, action: echo}]\n"
	r := warden(t, spec, "schedule", "add", "nightly", "--cron", "0 3 * * *", "--server", e.url)
	if r.code != exitOK || !strings.Contains(r.stdout, "schedule nightly added; next tick") {
		t.Fatalf("add: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if r := warden(t, spec, "schedule", "add", "nightly", "--every", "1h", "--server", e.url); r.code != exitUsage {
		t.Fatalf("second add: exit %d, want %d (%q)", r.code, exitUsage, r.stderr)
	}
	if r := warden(t, spec, "schedule", "add", "bad", "--cron", "0 25 * * *", "--server", e.url); r.code != exitUsage || !strings.Contains(r.stderr, "hour") {
		t.Fatalf("bad cron: exit %d %q", r.code, r.stderr)
	}
	if r := warden(t, spec, "schedule", "add", "both", "--cron", "@daily", "--every", "1h", "--server", e.url); r.code != exitUsage {
		t.Fatalf("both: exit %d", r.code)
	}
	if r := warden(t, spec, "schedule", "add", "often", "--every", "90s", "--catchup", "skip", "--server", e.url); r.code != exitOK {
		t.Fatalf("add every: exit %d %q", r.code, r.stderr)
	}
	r = warden(t, "", "schedule", "ls", "--server", e.url)
	if r.code != exitOK || !strings.Contains(r.stdout, "nightly") || !strings.Contains(r.stdout, "0 3 * * *") || !strings.Contains(r.stdout, "@every 90s") {
		t.Fatalf("ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	t.Logf("warden schedule ls:\n%s", r.stdout)
	r = warden(t, "", "schedule", "ls", "--json", "--server", e.url)
	var list []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 2 || list[1]["catchup"] != "skip" {
		t.Fatalf("ls --json: %v %s", err, r.stdout)
	}
	if r := warden(t, "", "schedule", "rm", "nightly", "--server", e.url); r.code != exitOK {
		t.Fatalf("rm: exit %d %q", r.code, r.stderr)
	}
	if r := warden(t, "", "schedule", "rm", "nightly", "--server", e.url); r.code != exitNotFound {
		t.Fatalf("rm again: exit %d, want %d", r.code, exitNotFound)
	}
}

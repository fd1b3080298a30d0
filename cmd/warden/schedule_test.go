package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/streams"
)

func TestScheduleAddLsRm(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// A scheduler (or `warden setup`) creates the schedules stream; the CLI
	// never writes stream definitions.
	if err := streams.EnsureWorkflow(context.Background(), e.js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
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

// The CLI never writes stream definitions: its one-replica idea of
// WARDEN_SCHEDULES rewrote a deployment's replicated stream (or, with the
// admin and readonly credentials, was refused and every schedule command
// failed). A definition it does not recognise is left alone.
func TestScheduleCommandsLeaveTheStreamAlone(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	if err := streams.EnsureWorkflow(ctx, e.js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	st, err := e.js.Stream(ctx, streams.StreamSchedules)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.Metadata[streams.MetadataConfigHash] = "set-up-elsewhere"
	cfg.Description = "as the operator's setup left it"
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if r := warden(t, "", "schedule", "ls", "--server", e.url); r.code != exitOK {
		t.Fatalf("schedule ls: exit %d %s", r.code, r.stderr)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Description != "as the operator's setup left it" || info.Config.Metadata[streams.MetadataConfigHash] != "set-up-elsewhere" {
		t.Fatalf("schedule ls rewrote %s: %q %v", streams.StreamSchedules, info.Config.Description, info.Config.Metadata)
	}
}

// schedule add printed the next tick in the machine's local time with no
// zone ("2026-11-24 03:00:00"): a reader could not tell which 3 AM. It is
// printed in RFC 3339 in the schedule's own zone (UTC unless --tz), the
// instant `schedule ls --json` reports.
func TestScheduleAddPrintsNextTickWithZone(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if err := streams.EnsureWorkflow(context.Background(), e.js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	spec := "name: report\nsteps: [{id: a, action: echo}]\n"
	for _, c := range []struct {
		name string
		tz   []string
		loc  *time.Location
	}{
		{"utc", nil, time.UTC},
		{"ny", []string{"--tz", "America/New_York"}, ny},
	} {
		r := warden(t, spec, append([]string{"schedule", "add", c.name, "--cron", "0 3 * * *", "--server", e.url}, c.tz...)...)
		const prefix = "next tick "
		i := strings.Index(r.stdout, prefix)
		if r.code != exitOK || i < 0 {
			t.Fatalf("add %s: exit %d, %q %q", c.name, r.code, r.stdout, r.stderr)
		}
		text := strings.Fields(r.stdout[i+len(prefix):])[0]
		printed, err := time.Parse(time.RFC3339, text)
		if err != nil {
			t.Errorf("add %s: next tick %q has no zone: %v (stdout %q)", c.name, text, err, r.stdout)
			continue
		}
		// 03:00 in the schedule's zone, with that zone's offset then.
		_, want := printed.In(c.loc).Zone()
		if _, got := printed.Zone(); printed.Hour() != 3 || printed.Minute() != 0 || got != want {
			t.Errorf("add %s: next tick %s, want 03:00 at offset %ds", c.name, text, want)
		}
		r = warden(t, "", "schedule", "ls", "--json", "--server", e.url)
		var list []struct {
			Name string    `json:"name"`
			Next time.Time `json:"next"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
			t.Fatalf("ls --json: %v %s", err, r.stdout)
		}
		for _, s := range list {
			if s.Name == c.name && !s.Next.Equal(printed) {
				t.Errorf("add %s printed %s; ls says the tick is %s", c.name, text, s.Next.Format(time.RFC3339))
			}
		}
	}
}

// A schedule whose spec sets an idempotency_key was reported as a usage
// error, with "Run 'warden --help' for usage." after it, as if the command
// had been called wrong. It is invalid input, said as submit says an
// invalid spec: exit 2, the reason alone, invalid_argument with --json.
func TestScheduleAddInvalidSpecIsNotAUsageError(t *testing.T) {
	t.Parallel()
	spec := "name: report\nidempotency_key: nightly\nsteps: [{id: a, action: echo}]\n"
	r := warden(t, spec, "schedule", "add", "keyed", "--cron", "0 3 * * *", "--server", "nats://127.0.0.1:1")
	if r.code != exitUsage || !strings.Contains(r.stderr, "idempotency_key") || strings.Contains(r.stderr, "--help") {
		t.Fatalf("exit %d, stderr %q; want 2 naming idempotency_key, without the pointer to --help", r.code, r.stderr)
	}
	r = warden(t, spec, "schedule", "add", "keyed", "--cron", "0 3 * * *", "--json", "--server", "nats://127.0.0.1:1")
	var e struct {
		Error    string `json:"error"`
		Code     string `json:"code"`
		ExitCode int    `json:"exit_code"`
	}
	if err := json.Unmarshal([]byte(r.stderr), &e); err != nil || r.code != exitUsage || e.Code != "invalid_argument" || e.ExitCode != exitUsage {
		t.Fatalf("--json: exit %d, stderr %q (%v)", r.code, r.stderr, err)
	}
}

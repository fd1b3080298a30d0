package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The dashboard followed every event type and re-read its whole view at
// most every 500 ms for any of them, in every open tab: the overview
// (which scans every job record, presence, health, the shards and two
// event listings) twice a second on a busy system, the job view for
// other jobs' steps. Its dead-letter view asked for 200 letters, oldest
// first, whole, and counted the page as "stored".
//
// The served app.js is run in Node against a fake DOM, fetch and clock
// (testdata/dashboard_harness.js): each view follows only its event types
// (?types=), re-reads itself at most every few seconds, the job view only
// for its own job's events; the dead-letter view asks for a page and
// shows the stream's count.
func TestDashboardFollowsOnlyWhatItsViewShows(t *testing.T) {
	t.Parallel()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node found: the dashboard's script test is skipped")
	}
	b := setup(t, nil)
	r := b.call(t, "GET", "/app.js", "", nil)
	if r.status != http.StatusOK {
		t.Fatalf("GET /app.js: %d", r.status)
	}
	app := filepath.Join(t.TempDir(), "app.js")
	if err := os.WriteFile(app, r.body, 0o644); err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(c, node, "testdata/dashboard_harness.js", app).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("harness: %v\n%s", err, stderr)
	}
	var got struct {
		OverviewTypes           string
		OverviewReloads         int
		StreamEndedOnViewChange bool
		JobTypes                string
		JobReloadsForOtherJobs  int
		JobReloadsForItsJob     int
		DLQTypes                string
		DLQList                 string
		DLQText                 string
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("harness output %s: %v", out, err)
	}
	if got.OverviewTypes != "agent,event,job" {
		t.Errorf("the overview follows types %q, want agent,event,job", got.OverviewTypes)
	}
	// Twenty job events, 500 ms apart, then 5 s of quiet (simulated).
	if got.OverviewReloads < 1 || got.OverviewReloads > 3 {
		t.Errorf("the overview re-read itself %d times for 20 events over 10 s, want 1 to 3", got.OverviewReloads)
	}
	if !got.StreamEndedOnViewChange || got.JobTypes != "job,step" {
		t.Errorf("the job view: stream of the overview ended %v, follows %q, want job,step", got.StreamEndedOnViewChange, got.JobTypes)
	}
	if got.JobReloadsForOtherJobs != 0 || got.JobReloadsForItsJob != 1 {
		t.Errorf("the job view re-read itself %d times for another job's events, %d for its own: want 0 and 1",
			got.JobReloadsForOtherJobs, got.JobReloadsForItsJob)
	}
	if got.DLQTypes != "event" || !strings.Contains(got.DLQList, "limit=100") || !strings.Contains(got.DLQList, "after=0") {
		t.Errorf("the dead-letter view follows %q and lists with %s, want event and limit=100&after=0", got.DLQTypes, got.DLQList)
	}
	if !strings.Contains(got.DLQText, "1234 stored") {
		t.Errorf("the dead-letter view does not show the stream's count (1234): %s", got.DLQText)
	}
}

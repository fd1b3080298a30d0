package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/spec"
)

// TestListJobsTimeOffsetUnencoded: an RFC 3339 time written in a URL as
// it is, its offset's + unencoded, reads as that time in created_after and
// created_before (the query decoding turned the + into a space), as it
// does encoded (%2B); anything else that is not RFC 3339 is a 400 that
// names the parameter and the format.
func TestListJobsTimeOffsetUnencoded(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.jobCreatedAt(t, "job-early", time.Date(2026, 11, 27, 8, 30, 0, 0, time.UTC))
	b.jobCreatedAt(t, "job-late", time.Date(2026, 11, 27, 9, 30, 0, 0, time.UTC))

	// 10:00 at +01:00 is 09:00 UTC: between the two jobs. Read as 10:00
	// UTC it would keep job-early before it and nothing after it.
	for _, c := range []struct{ query, want string }{
		{"created_after=2026-11-27T10:00:00+01:00", "job-late"},
		{"created_after=2026-11-27T10:00:00%2B01:00", "job-late"},
		{"created_after=2026-11-27T10:00:00.000+01:00", "job-late"},
		{"created_before=2026-11-27T10:00:00+01:00", "job-early"},
		{"created_before=2026-11-27T10:00:00%2B01:00", "job-early"},
		{"created_after=2026-11-27T09:00:00Z", "job-late"},
		{"created_after=2026-11-27T08:00:00-01:00", "job-late"},
		{"created_after=2026-11-27T08:00:00%2B00:00&created_before=2026-11-27T10:00:00+01:00", "job-early"},
	} {
		r := b.call(t, "GET", "/api/v1/jobs?"+c.query, readToken, nil)
		if r.status != http.StatusOK {
			t.Errorf("?%s: %d %s", c.query, r.status, r.body)
			continue
		}
		var page ops.JobsPage
		r.decode(t, &page)
		var got []string
		for _, j := range page.Jobs {
			got = append(got, j.ID)
		}
		if len(got) != 1 || got[0] != c.want {
			t.Errorf("?%s: jobs %v, want [%s]", c.query, got, c.want)
		}
	}

	for _, c := range []struct{ query, param string }{
		{"created_after=monday", "created_after"},
		{"created_before=2026-11-27", "created_before"},
		{"created_after=2026-11-27%2010:00:00+01:00", "created_after"},
		{"created_before=2026-11-27T10:00:00+01:00+02:00", "created_before"},
		{"created_after=2026-11-27T10:00:00++01:00", "created_after"},
	} {
		r := b.call(t, "GET", "/api/v1/jobs?"+c.query, readToken, nil)
		wantError(t, "?"+c.query, r, http.StatusBadRequest, ops.CodeInvalid)
		if msg := string(r.body); !strings.Contains(msg, c.param) || !strings.Contains(msg, "RFC 3339") {
			t.Errorf("?%s: the error names neither %s nor the format: %s", c.query, c.param, msg)
		}
	}
}

// jobCreatedAt stores a succeeded one-step job accepted at created.
func (b bundle) jobCreatedAt(t *testing.T, id string, created time.Time) {
	t.Helper()
	sp := spec.Job{Name: "job " + id, Steps: []spec.Step{{ID: "a", Action: "echo"}}}
	steps, err := jobstore.NewSteps(id, sp, jobstore.StepDefaults{Timeout: time.Minute}, created)
	if err != nil {
		t.Fatal(err)
	}
	steps[0].State = jobstore.StepSucceeded
	if _, err := b.store.CreateStep(ctx(t), steps[0]); err != nil {
		t.Fatal(err)
	}
	j := jobstore.NewJob(id, sp, created)
	j.State, j.FinishedAt = jobstore.JobSucceeded, created
	if _, err := b.store.CreateJob(ctx(t), j); err != nil {
		t.Fatal(err)
	}
}

// since and created_after both bound a job's creation from below; given
// both, created_after silently replaced since. Refused now.
func TestListJobsSinceWithCreatedAfterIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.call(t, "GET", "/api/v1/jobs?since=1h&created_after=2026-11-27T10:00:00Z", readToken, nil)
	wantError(t, "since and created_after", r, http.StatusBadRequest, ops.CodeInvalid)
	if !strings.Contains(string(r.body), "since") || !strings.Contains(string(r.body), "created_after") {
		t.Errorf("the error names neither parameter: %s", r.body)
	}
}

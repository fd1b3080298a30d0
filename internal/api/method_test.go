package api_test

import (
	"net/http"
	"testing"
)

// A known path asked with a method it does not take is 405 with Allow:
// the catch-all under /api/ matched first and answered 404 "no route",
// as for a path that does not exist. (Found by a reviewer.)
//
// Old code: "DELETE /api/v1/jobs/job-1: 404 … no route".
func TestWrongMethodIs405(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.call(t, "DELETE", "/api/v1/jobs/job-1", adminToken, nil)
	if r.status != http.StatusMethodNotAllowed || r.header.Get("Allow") != "GET" {
		t.Fatalf("DELETE /api/v1/jobs/job-1: %d (Allow %q) %s", r.status, r.header.Get("Allow"), r.body)
	}
	if r := b.call(t, "GET", "/api/v1/nothing-here", adminToken, nil); r.status != http.StatusNotFound {
		t.Fatalf("GET of an unknown path: %d %s", r.status, r.body)
	}
}

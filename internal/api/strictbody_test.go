package api_test

import (
	"net/http"
	"testing"

	"github.com/wardenhq/warden/internal/ops"
)

// Cluster request bodies are read strictly, as job specs are: a typo
// ("form" for "from") asked for a failover with no source, as if none had
// been named, and a definition followed by more JSON was taken. (Found by
// a reviewer.)
//
// Old code: "definition with data after it: status 201, want 400"; the
// reviewer's: "failover {form, to}: status 202, want 400".
func TestClusterBodiesAreReadStrictly(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	def := `{"name": "web", "replication_mode": "active_passive", "membership": {"minimum_agents": 1, "desired_agents": 2}}`
	wantError(t, "definition with data after it", b.call(t, "POST", "/api/v1/clusters", adminToken, []byte(def+` {"name": "other"}`)),
		http.StatusBadRequest, ops.CodeInvalid)
	if r := b.call(t, "POST", "/api/v1/clusters", adminToken, []byte(def)); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	wantError(t, "failover {form, to}", b.call(t, "POST", "/api/v1/clusters/web/failover", adminToken, []byte(`{"form": "default.a1", "to": "default.a2"}`)),
		http.StatusBadRequest, ops.CodeInvalid)
	wantError(t, "failover with data after it", b.call(t, "POST", "/api/v1/clusters/web/failover", adminToken, []byte(`{"to": "default.a2"}]`)),
		http.StatusBadRequest, ops.CodeInvalid)
}

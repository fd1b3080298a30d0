package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/cluster"
)

// A failover asked of a cluster with no leader timed out, and the CLI said
// it was not handled, but the request stayed: the leader elected later
// carried it out. The CLI now withdraws what it gave up on.
func TestClusterRequestGivenUpIsWithdrawn(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if r := warden(t, clusterYAML, "--server", e.url, "cluster", "create", "-f", "-"); r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	// No member runs: nobody leads.
	r := warden(t, "", "--server", e.url, "--timeout", "1s", "cluster", "failover", "prod-docker", "--reason", "nobody leads")
	if r.code != exitUnavailable || !strings.Contains(r.stderr, "withdrawn") {
		t.Fatalf("failover with no leader: %+v, want exit %d saying the request is withdrawn", r, exitUnavailable)
	}
	st, err := cluster.Open(context.Background(), e.js)
	if err != nil {
		t.Fatal(err)
	}
	lister, err := st.Runtime().ListKeysFiltered(context.Background(), "prod-docker.req.*")
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		t.Fatal(err)
	}
	var left []string
	if lister != nil {
		for k := range lister.Keys() {
			left = append(left, k)
		}
	}
	if len(left) != 0 {
		t.Fatalf("requests left for a later leader to carry out: %v", left)
	}
}

package api_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestGrafanaDashboard: configs/grafana/warden.json is valid JSON and
// charts every seed metric.
func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../configs/grafana/warden.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var exprs strings.Builder
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs.WriteString(tg.Expr + "\n")
		}
	}
	for _, m := range []string{"warden_cluster_members", "warden_cluster_leader", "warden_cluster_health", "warden_failovers_total",
		"warden_failover_duration_seconds", "warden_tasks_transferred_total", "warden_queue_depth", "warden_queue_latency_seconds",
		"warden_dead_letter_queue_depth", "warden_healing_actions_total", "warden_healing_cycle_duration_seconds", "warden_health_score",
		"warden_heartbeat_age_seconds", "warden_task_completion_rate", "warden_assignment_score", "warden_retries_total"} {
		if !strings.Contains(exprs.String(), m) {
			t.Errorf("the Grafana dashboard does not chart %s", m)
		}
	}
}

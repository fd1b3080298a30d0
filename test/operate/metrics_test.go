package operate

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// sample is one line of the Prometheus text format.
type sample struct {
	name, labels string
	value        float64
}

func scrapeOne(t *testing.T, addr string) []sample {
	t.Helper()
	for _, p := range []string{"/healthz", "/readyz"} {
		res, err := http.Get("http://" + addr + p)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Errorf("%s%s: %d", addr, p, res.StatusCode)
		}
	}
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var out []sample
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		name, labels := line[:i], ""
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name, labels = name[:j], name[j:]
		}
		out = append(out, sample{name, labels, v})
	}
	return out
}

// scrape reads every process's /metrics (and /healthz, /readyz) and checks
// that each seed metric is served by some process with a plausible value.
func scrape(t *testing.T, e *env) {
	all := map[string][]sample{}
	where := map[string]string{}
	for proc, addr := range e.metrics {
		for _, s := range scrapeOne(t, addr) {
			all[s.name] = append(all[s.name], s)
			where[s.name] = proc
		}
	}
	type check struct {
		name string
		ok   func(v []sample) bool
		want string
	}
	sum := func(v []sample) float64 {
		var n float64
		for _, s := range v {
			n += s.value
		}
		return n
	}
	atLeast := func(n float64) func([]sample) bool { return func(v []sample) bool { return sum(v) >= n } }
	unit := func(v []sample) bool {
		for _, s := range v {
			if s.value < 0 || s.value > 1 {
				return false
			}
		}
		return len(v) > 0
	}
	present := func(v []sample) bool { return len(v) > 0 }
	checks := []check{
		{"warden_cluster_members", atLeast(1), "≥ 1 member of cluster ops"},
		{"warden_cluster_leader", atLeast(1), "cluster ops has a leader"},
		{"warden_cluster_health", unit, "in 0..1"},
		{"warden_failovers_total", atLeast(1), "≥ 1 (the victim)"},
		{"warden_failover_duration_seconds_count", atLeast(1), "≥ 1 observation"},
		{"warden_tasks_transferred_total", present, "served"},
		{"warden_queue_depth", present, "served, by pool"},
		{"warden_queue_latency_seconds_count", atLeast(1), "≥ 1 job dispatched"},
		{"warden_dead_letter_queue_depth", atLeast(1), "1 (the poison task)"},
		{"warden_healing_actions_total", present, "served, by type"},
		{"warden_healing_cycle_duration_seconds_count", atLeast(1), "≥ 1 cycle"},
		{"warden_health_score", unit, "in 0..1 per agent"},
		{"warden_heartbeat_age_seconds", func(v []sample) bool {
			for _, s := range v {
				if s.value < 0 || s.value > 60 {
					return false
				}
			}
			return len(v) >= 3
		}, "0..60 s for each of ≥ 3 agents"},
		{"warden_task_completion_rate", unit, "in 0..1 per agent and cluster"},
		{"warden_assignment_score", unit, "in 0..1 per agent"},
		{"warden_retries_total", atLeast(1), "≥ 1 (the poison step was taken back)"},
	}
	for _, c := range checks {
		v := all[c.name]
		if !c.ok(v) {
			t.Errorf("%s: %v, want %s", c.name, v, c.want)
			continue
		}
		t.Logf("%-45s %-10s sum %g over %d series", c.name, where[c.name], sum(v), len(v))
	}
}

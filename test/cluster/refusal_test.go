package cluster_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/procs"
)

// TestStandbyRefusingTasksIsNotDrained: a standby refuses the cluster tasks
// that reach it (reroute: not its epoch) without running them. That is what
// a killed leader does when it comes back: the tasks dispatched to it before
// the state moved the leadership wait in its queue and are refused. The
// refusals must not count as failures: the supervisor (default self-healing)
// would assess the standby — which runs nothing to make up for them — as
// failing every task, critical, and drain it; a drained member is offline
// and cannot lead, so after a few leader kills nobody can (cmd/bench's
// cluster phase ended "no leader and two standbys" this way).
func TestStandbyRefusingTasksIsNotDrained(t *testing.T) {
	t.Parallel()
	h := newHarness(t, definition("aprefuse", protocol.ModeActivePassive, "h1"))
	procs.Start(t, "supervisor", supervisorBin, "--server", h.srv.URL)
	for _, id := range []string{"a", "b"} {
		h.start(id)
	}
	st := waitLeader(t, h, 1)
	standby := "a"
	if st.Leader == "p.a" {
		standby = "b"
	}

	// More refusals than the health window's min_tasks (5).
	ctx := context.Background()
	var jobs []string
	for range 8 {
		jobs = append(jobs, h.publish(ctx, "p."+standby, st.Epoch, "h1", "echo", `{"message":"x"}`))
	}
	natstest.Eventually(t, 20*time.Second, "the standby refuses every task", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, j := range jobs {
			if r, ok := h.results[j]; !ok || r.ErrorClass != protocol.ClassReroute || r.Agent != standby {
				return false
			}
		}
		return true
	})
	refused := time.Now()

	// The agent's own counters, as its heartbeats tell the supervisor.
	presence, err := h.js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	var p protocol.Presence
	natstest.Eventually(t, 10*time.Second, "a heartbeat after the refusals", func() bool {
		e, err := presence.Get(ctx, protocol.PresenceKey("p", standby))
		return err == nil && json.Unmarshal(e.Value(), &p) == nil && p.HeartbeatAt.After(refused.Add(time.Second))
	})
	if p.Failed != 0 {
		t.Errorf("standby's heartbeat counts %d failed tasks for %d refused unrun", p.Failed, len(jobs))
	}

	// The supervisor's assessment made after it saw them (stored at once
	// when it changes, else refreshed every 30 s).
	records, err := h.js.KeyValue(ctx, protocol.BucketHealth)
	if err != nil {
		t.Fatal(err)
	}
	var rec health.Record
	natstest.Eventually(t, 60*time.Second, "an assessment of the standby after its refusals", func() bool {
		e, err := records.Get(ctx, protocol.PresenceKey("p", standby))
		return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.AssessedAt.After(refused.Add(2*time.Second))
	})
	t.Logf("standby %s after %d refusals: level %s, action %q, reasons %s", standby, len(jobs), rec.Level, rec.Action, strings.Join(rec.Reasons, "; "))
	if rec.Action == supervisor.ActionDrain || rec.Action == supervisor.ActionFailover || rec.Level.Worse(health.Warning) {
		t.Fatalf("standby assessed %s (action %q) for tasks it refused: %s", rec.Level, rec.Action, strings.Join(rec.Reasons, "; "))
	}
	if st := h.state(); roleOf(st, standby) != protocol.RoleStandby {
		t.Fatalf("standby %s is %s: %s", standby, roleOf(st, standby), roles(st))
	}
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/test/procs"
)

func TestSickAgentIsDrainedAndItsWorkCompletesElsewhere(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	ledger := filepath.Join(dir, "ledger")
	supCfg := filepath.Join(dir, "supervisor.yaml")
	if err := os.WriteFile(supCfg, []byte("cycle_interval: 300ms\ndrain_timeout: 2s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	procs.Start(t, "scheduler", bins["scheduler"], "--server", e.srv.URL)
	procs.Start(t, "supervisor", bins["supervisor"], "--server", e.srv.URL, "--config", supCfg)
	// "a-sick" sorts first, so ties go to it: it gets work until health says otherwise.
	procs.Start(t, "a-sick", bins["testagent"], "--server", e.srv.URL, "--id", "a-sick", "--capabilities", "x", "--ledger", ledger, "--fail", "10", "--max-concurrent", "1")
	e.testAgent(t, "b-good", "x", ledger)
	for _, id := range []string{"a-sick", "b-good"} {
		natstest.Eventually(t, 10*time.Second, id+" present", func() bool { _, ok := e.presence(t, id); return ok })
	}
	const jobs = 40
	for i := range jobs {
		e.submit(t, fmt.Sprintf("job-h%02d", i), "name: h\nsteps: [{id: s, action: ledger, params: {duration: 300ms}, requires: [x], max_retries: 10, retry: {base_backoff: 100ms, max_backoff: 300ms}}]")
	}
	natstest.Eventually(t, 60*time.Second, "all jobs succeed", func() bool {
		for i := range jobs {
			j, _, err := e.store.Job(context.Background(), fmt.Sprintf("job-h%02d", i))
			if err != nil || j.State != jobstore.JobSucceeded {
				return false
			}
		}
		return true
	})
	var actions []string
	natstest.Eventually(t, 10*time.Second, "the sick agent drained", func() bool {
		actions = nil
		drained := false
		for _, ev := range e.events(t, "healing") {
			if ev.Agent == "a-sick" {
				actions = append(actions, ev.Data["action"]+"("+ev.Data["level"]+")")
				drained = drained || ev.Data["action"] == "drain"
			}
		}
		return drained
	})
	t.Logf("healing history of a-sick: %v", actions)
	natstest.Eventually(t, 5*time.Second, "a-sick announces draining", func() bool {
		p, ok := e.presence(t, "a-sick")
		return ok && p.Draining
	})
	for _, ev := range e.events(t, "healing") {
		if ev.Agent == "b-good" {
			t.Errorf("healthy agent healed: %+v", ev.Data)
		}
	}
	onGood := 0
	for i := range jobs {
		if st := e.step(t, fmt.Sprintf("job-h%02d", i), "s"); st.Actor == "b-good" {
			onGood++
		}
	}
	t.Logf("%d of %d steps finally succeeded on b-good", onGood, jobs)
	for _, args := range [][]string{{"healing", "ls"}, {"agents", "ls"}} {
		p := procs.Start(t, "warden "+strings.Join(args, " "), bins["warden"], append([]string{"--server", e.srv.URL}, args...)...)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		code, err := p.Wait(ctx)
		cancel()
		out := p.Output()
		if err != nil || code != 0 || !strings.Contains(out, "a-sick") || !strings.Contains(out, "critical") {
			t.Errorf("warden %v (exit %d, %v) does not show a-sick as critical:\n%s", args, code, err, out)
		}
		t.Logf("warden %s:\n%s", strings.Join(args, " "), out)
	}
}

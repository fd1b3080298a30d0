package agent

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/pkg/protocol"
)

// recentReports is bounded in count, in time (recentReportsFor, or the
// task's deadline if later) and in the bytes of the bodies it keeps; a
// result whose body was dropped is still known.
func TestRecentReportsBounds(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	task := func(job string) protocol.Task {
		return protocol.Task{JobID: job, StepID: "s", Epoch: 1, Attempt: 1, Token: "tok"}
	}
	msg := func(n int) *nats.Msg {
		m := nats.NewMsg("warden.result.p.a.j.s")
		m.Data = make([]byte, n)
		return m
	}
	ok := func(r *recentReports, job string, at time.Time) (bool, bool) {
		m, ok := r.get(task(job), at)
		return ok, m != nil
	}
	res := protocol.Result{Status: protocol.ResultSucceeded}

	r := newRecentReports(2, 1<<20)
	r.add(task("j1"), res, msg(10), time.Time{}, now)
	r.add(task("j2"), res, msg(10), now.Add(time.Hour), now)
	if known, _ := ok(r, "j1", now.Add(recentReportsFor)); !known {
		t.Fatal("forgotten within recentReportsFor")
	}
	if known, _ := ok(r, "j1", now.Add(recentReportsFor+time.Nanosecond)); known {
		t.Fatal("remembered past recentReportsFor")
	}
	if known, _ := ok(r, "j2", now.Add(30*time.Minute)); !known {
		t.Fatal("forgotten before its task's deadline")
	}
	other := task("j2")
	other.Token = "another"
	if _, known := r.get(other, now); known {
		t.Fatal("matched another lease token")
	}
	other = task("j2")
	other.Attempt = 2
	if _, known := r.get(other, now); known {
		t.Fatal("matched another attempt")
	}
	r.add(task("j3"), res, msg(10), time.Time{}, now)
	r.add(task("j4"), res, msg(10), time.Time{}, now)
	if known, _ := ok(r, "j2", now); known {
		t.Fatal("more than 2 kept")
	}
	if r.order.Len() != 2 || len(r.byKey) != 2 || len(r.byStep) != 2 {
		t.Fatalf("kept %d, %d keys, %d steps; want 2", r.order.Len(), len(r.byKey), len(r.byStep))
	}

	r = newRecentReports(10, 100)
	r.add(task("j1"), res, msg(60), time.Time{}, now)
	r.add(task("j2"), res, msg(60), time.Time{}, now)
	if known, body := ok(r, "j1", now); !known || body {
		t.Fatalf("over the byte bound: oldest known %v with body %v, want known without", known, body)
	}
	if known, body := ok(r, "j2", now); !known || !body {
		t.Fatalf("newest known %v with body %v, want both", known, body)
	}
	if r.bytes != 60 {
		t.Fatalf("bodies of %d bytes counted, want 60", r.bytes)
	}
}

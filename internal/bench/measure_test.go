package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// Targets stated as strictly less than: a value equal to the goal is not met.
func TestBelowIsStrict(t *testing.T) {
	if f := below(Figure{Value: 5}, 5, "ms"); f.Met != "no" || f.Target != "< 5 ms" {
		t.Errorf("below(5, 5) = %q %q, want no, < 5 ms", f.Met, f.Target)
	}
	if f := below(Figure{Value: 4.99}, 5, "ms"); f.Met != "yes" {
		t.Errorf("below(4.99, 5) = %q, want yes", f.Met)
	}
	if f := atMost(Figure{Value: 5}, 5, "ms"); f.Met != "yes" {
		t.Errorf("atMost(5, 5) = %q, want yes", f.Met)
	}
}

// Paced jobs are timed from when they were due; missing times are counted,
// never turned into a value.
func TestHalfLatenciesFromDueTime(t *testing.T) {
	start := time.Unix(1000, 0)
	due := map[string]time.Time{"a": dueAt(start, 100, 0), "b": dueAt(start, 100, 1), "c": dueAt(start, 100, 2)}
	if got := due["b"].Sub(start); got != 10*time.Millisecond {
		t.Fatalf("job 1 at 100/s due after %s, want 10ms", got)
	}
	// b was sent 40 ms late (a stalled sender) and dispatched 1 ms later.
	sent := map[string]time.Time{"a": due["a"], "b": due["b"].Add(40 * time.Millisecond), "c": due["c"]}
	disp := map[string]time.Time{"a": due["a"].Add(time.Millisecond), "b": sent["b"].Add(time.Millisecond)}
	fin := map[string]time.Time{"a": due["a"].Add(2 * time.Millisecond), "b": sent["b"].Add(2 * time.Millisecond), "c": due["c"].Add(3 * time.Millisecond)}
	get := func(m map[string]time.Time) func(string) (time.Time, bool) {
		return func(id string) (time.Time, bool) { v, ok := m[id]; return v, ok }
	}
	l := halfLatencies(due, sent, get(disp), get(fin))
	if l.missingDisp != 1 || l.missingComp != 0 {
		t.Errorf("missing dispatch %d, completion %d; want 1, 0", l.missingDisp, l.missingComp)
	}
	if got := percentile(l.disp, 100); got != 41*time.Millisecond {
		t.Errorf("dispatch max from due %s, want 41ms", got)
	}
	if got := percentile(l.dispSent, 100); got != time.Millisecond {
		t.Errorf("dispatch max from send %s, want 1ms", got)
	}
	for _, d := range l.disp {
		if d < 0 {
			t.Errorf("negative dispatch time %s", d)
		}
	}
}

func TestMarkdownNamesRevision(t *testing.T) {
	r := NewReport()
	r.Set("git_revision", "abc123")
	r.Set("git_dirty", true)
	r.Add(Figure{Section: "s", Key: "k", Label: "l", Value: 1, Unit: "ms"})
	var b bytes.Buffer
	r.WriteMarkdown(&b, nil)
	if !strings.HasPrefix(b.String(), "Revision: `abc123` (uncommitted changes in the tree)") {
		t.Errorf("markdown starts %q", b.String())
	}
}

// pace sends no call before it is due, and each one by the tick after it.
func TestPaceNeverEarly(t *testing.T) {
	var lags []time.Duration
	pace(200, 10, func(i int, due time.Time) {
		lags = append(lags, time.Since(due))
	})
	if len(lags) != 10 {
		t.Fatalf("%d calls, want 10", len(lags))
	}
	for i, l := range lags {
		if l < 0 {
			t.Errorf("call %d sent %s before it was due", i, -l)
		}
	}
	// Not an interval late by construction (5 ms at 200/s): allow a busy
	// machine's timer slack, but catch the off-by-one.
	if m := percentile(lags, 50); m >= 4*time.Millisecond {
		t.Errorf("median lateness %s at 200/s", m)
	}
}

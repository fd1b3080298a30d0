package presence

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

func TestLivenessRefresh(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 26, 8, 0, 0, 0, time.UTC)
	base := protocol.Presence{ID: "a1", Pool: "p", Actions: []string{"echo"}, MaxConcurrent: 4, Host: "h", PID: 1,
		StartedAt: t0, HeartbeatAt: t0, TaskStream: protocol.TaskStream(0), TaskSubject: protocol.TaskSubject(0, "p", "a1")}
	rec := func(edit func(*protocol.Presence)) []byte { return encodeEdited(t, base, edit) }
	later := t0.Add(1234567 * time.Microsecond) // another length of fraction
	old := rec(nil)
	for _, c := range []struct {
		name string
		b    []byte
		same bool
	}{
		{"heartbeat only", rec(func(p *protocol.Presence) { p.HeartbeatAt = later }), true},
		{"identical", rec(nil), true},
		{"in flight", rec(func(p *protocol.Presence) { p.HeartbeatAt, p.InFlight = later, 1 }), false},
		{"draining", rec(func(p *protocol.Presence) { p.HeartbeatAt, p.Draining = later, true }), false},
		{"in flight, same heartbeat", rec(func(p *protocol.Presence) { p.InFlight = 1 }), false},
		{"heartbeat_at also a label", rec(func(p *protocol.Presence) {
			p.HeartbeatAt, p.Labels = later, map[string]string{"heartbeat_at": "x"}
		}), false},
		{"written with spaces", []byte(`{"id": "a1", "pool": "p", "heartbeat_at": "2026-11-26T08:00:01Z"}`), false},
		{"no heartbeat", []byte(`{"id":"a1","pool":"p"}`), false},
		{"not a time", []byte(`{"id":"a1","pool":"p","heartbeat_at":"soon"}`), false},
	} {
		at, same := liveness(old, c.b)
		if same != c.same {
			t.Errorf("%s: same = %v, want %v", c.name, same, c.same)
			continue
		}
		if !same {
			continue
		}
		var p protocol.Presence
		if err := json.Unmarshal(c.b, &p); err != nil {
			t.Fatal(err)
		}
		if !at.Equal(p.HeartbeatAt) {
			t.Errorf("%s: heartbeat %s, the record says %s", c.name, at, p.HeartbeatAt)
		}
	}
	// A label that looks like the member, in both records, is not taken
	// for the heartbeat.
	lab := func(at time.Time) []byte {
		return rec(func(p *protocol.Presence) {
			p.HeartbeatAt, p.Labels = at, map[string]string{"heartbeat_at": "2026-11-26T09:00:00Z"}
		})
	}
	if at, same := liveness(lab(t0), lab(later)); same && !at.Equal(later) {
		t.Errorf("a label named heartbeat_at taken for the heartbeat: %s, want %s", at, later)
	}
}

// liveness reports whether the View takes record b, after record a, for a
// liveness refresh (only heartbeat_at moved), and the heartbeat it reads.
func liveness(a, b []byte) (time.Time, bool) {
	var prev protocol.Presence
	if json.Unmarshal(a, &prev) != nil {
		return time.Time{}, false
	}
	p, beat, ok := patch(a, b, prev)
	return p.HeartbeatAt, ok && beat
}

func TestUtilisationReportedOnMaterialChange(t *testing.T) {
	t.Parallel()
	a := &Announcer{}
	f := func(v float64) *float64 { return &v }
	if got := a.utilisation(nil); got != nil {
		t.Fatalf("no sample yet: %v", *got)
	}
	for i, c := range []struct {
		sample float64
		want   float64
	}{
		{0.1234, 0.12}, // first sample, whole percent
		{0.1512, 0.12}, // jitter below the step: the same record
		{0.0811, 0.12}, // still within the step
		{0.1801, 0.18}, // moved by a step: reported
		{0.95, 0.95},   // busy
		{0.9049, 0.95}, // still busy enough
		{0.8999, 0.9},  // a step down
		{0.0000, 0.0},  // idle
		{0.0499, 0.0},  // noise
	} {
		got := a.utilisation(f(c.sample))
		if got == nil || *got != c.want {
			t.Fatalf("sample %d (%v): reported %v, want %v", i, c.sample, got, c.want)
		}
	}
	if got := a.utilisation(nil); got == nil {
		t.Fatal("a missing sample dropped the value reported last")
	}
}

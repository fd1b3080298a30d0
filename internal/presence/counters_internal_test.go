package presence

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

func TestDynamicMembersCount(t *testing.T) {
	if len(dynamicMembers) != numDynamic {
		t.Fatalf("numDynamic is %d, dynamicMembers has %d", numDynamic, len(dynamicMembers))
	}
}

// sampleRecord is an SDK heartbeat as encoding/json writes it.
func sampleRecord(t testing.TB, edit func(*protocol.Presence)) []byte {
	t.Helper()
	u, h := 0.12, 1.0
	p := protocol.Presence{
		ID: "a1", Pool: "default", Capabilities: []string{"gpu"}, Actions: []string{"noop", "hold"},
		Labels: map[string]string{"zone": "eu-1"}, MaxConcurrent: 4, InFlight: 1, Succeeded: 10, Failed: 2,
		Version: "v1", Host: "h1", PID: 42, TaskStream: "WARDEN_TASKS_0", TaskSubject: "warden.task.0.default.a1",
		StartedAt: time.Date(2026, 11, 27, 9, 0, 0, 0, time.UTC), HeartbeatAt: time.Date(2026, 11, 27, 9, 1, 0, 123456789, time.UTC),
		Consumer: "a1", HeartbeatInterval: protocol.Duration(time.Second), QueueDepth: 3, Utilisation: &u, Health: &h,
	}
	if edit != nil {
		edit(&p)
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkPatch holds patchDynamic to encoding/json: when it answers, its
// answer is what decoding b in full gives.
func checkPatch(t *testing.T, a, b []byte) (patched bool) {
	t.Helper()
	var prev protocol.Presence
	if json.Unmarshal(a, &prev) != nil {
		return false
	}
	got, ok := patchDynamic(a, b, prev)
	if !ok {
		return false
	}
	var want protocol.Presence
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatalf("patched a record encoding/json refuses (%v):\na: %s\nb: %s", err, a, b)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("patched record differs from the decoded one:\na: %s\nb: %s\ngot  %+v\nwant %+v", a, b, got, want)
	}
	return true
}

func TestPatchDynamicCounters(t *testing.T) {
	t.Parallel()
	a := sampleRecord(t, nil)
	for name, c := range map[string]struct {
		edit  func(*protocol.Presence)
		patch bool
	}{
		"counters and load": {func(p *protocol.Presence) {
			u := 0.5
			p.InFlight, p.Succeeded, p.Failed, p.QueueDepth, p.Utilisation = 3, 11, 3, 0, &u
			p.HeartbeatAt = p.HeartbeatAt.Add(time.Second)
		}, true},
		"optional members dropped": {func(p *protocol.Presence) { p.QueueDepth, p.Utilisation, p.Health = 0, nil, nil }, true},
		"a static member changed":  {func(p *protocol.Presence) { p.InFlight, p.Draining = 2, true }, false},
		"a label changed":          {func(p *protocol.Presence) { p.InFlight, p.Labels = 2, map[string]string{"zone": "eu-2"} }, false},
		"a label named like a counter": {func(p *protocol.Presence) {
			p.InFlight, p.Labels = 2, map[string]string{"zone": "eu-1", "in_flight": "7"}
		}, false},
		"a host with an escape": {func(p *protocol.Presence) { p.InFlight, p.Host = 2, `h"1` }, false},
	} {
		b := sampleRecord(t, c.edit)
		if got := checkPatch(t, a, b); got != c.patch {
			t.Errorf("%s: patched %v, want %v\na: %s\nb: %s", name, got, c.patch, a, b)
		}
	}
	// Spellings encoding/json would also decode into the counters.
	b := sampleRecord(t, func(p *protocol.Presence) { p.InFlight = 2 })
	for _, tricky := range []string{
		strings.Replace(string(b), `"pid":42`, `"pid":42,"IN_FLIGHT":9`, 1),
		strings.Replace(string(b), `"pid":42`, `"pid":42,"in\u005fflight":9`, 1),
		strings.Replace(string(b), `"pid":42`, `"pid":42,"ſucceeded":9`, 1),
		strings.Replace(string(b), `"in_flight":2`, `"in_flight":2.0`, 1),
		strings.Replace(string(b), `"in_flight":2`, `"in_flight":02`, 1),
		strings.Replace(string(b), `"in_flight":2`, `"in_flight": 2`, 1),
		strings.Replace(string(b), `"utilisation":0.12`, `"utilisation":null`, 1),
	} {
		checkPatch(t, a, []byte(tricky))
		if _, ok := patchDynamic(a, []byte(tricky), protocol.Presence{}); ok {
			t.Errorf("patched a record spelt unusually: %s", tricky)
		}
	}
}

func FuzzPatchDynamic(f *testing.F) {
	base := sampleRecord(f, nil)
	f.Add(base, sampleRecord(f, func(p *protocol.Presence) { p.InFlight, p.Succeeded = 2, 11 }))
	f.Add(base, sampleRecord(f, func(p *protocol.Presence) { p.QueueDepth, p.Utilisation = 0, nil }))
	f.Add(sampleRecord(f, func(p *protocol.Presence) { p.Labels = nil }), sampleRecord(f, func(p *protocol.Presence) { p.Labels, p.Failed = nil, 9 }))
	f.Add([]byte(`{"in_flight":1,"succeeded":2,"failed":3,"heartbeat_at":"2026-11-27T09:00:00Z"}`),
		[]byte(`{"in_flight":5,"succeeded":2,"failed":3,"heartbeat_at":"2026-11-27T09:00:01Z","health":1e-1}`))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		checkPatch(t, a, b)
	})
}

func BenchmarkPresenceDecode(b *testing.B) {
	a := sampleRecord(b, nil)
	next := sampleRecord(b, func(p *protocol.Presence) {
		p.InFlight, p.Succeeded = 2, 11
		p.HeartbeatAt = p.HeartbeatAt.Add(time.Second)
	})
	var prev protocol.Presence
	if err := json.Unmarshal(a, &prev); err != nil {
		b.Fatal(err)
	}
	b.Run("full", func(b *testing.B) {
		for b.Loop() {
			var p protocol.Presence
			if err := json.Unmarshal(next, &p); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("patch", func(b *testing.B) {
		for b.Loop() {
			if _, ok := patchDynamic(a, next, prev); !ok {
				b.Fatal("not patched")
			}
		}
	})
}

// FuzzPatchDynamicRecords fuzzes the values of SDK-written records, so
// that the patch is exercised on what agents write, with odd strings in
// the static members.
func FuzzPatchDynamicRecords(f *testing.F) {
	f.Add(1, uint64(10), 0.5, 3, "eu-1", "h1", true, 2, uint64(11), 0.25, 0, "eu-1", "h1", false)
	f.Add(0, uint64(0), 1.0, 0, `a"b\c`, "é", false, 5, uint64(1<<63), 1e-7, 9, `a"b\c`, "é", true)
	f.Fuzz(func(t *testing.T, inA int, sA uint64, uA float64, qA int, labA, hostA string, optA bool,
		inB int, sB uint64, uB float64, qB int, labB, hostB string, optB bool) {
		rec := func(in int, s uint64, u float64, q int, lab, host string, opt bool) []byte {
			return sampleRecord(t, func(p *protocol.Presence) {
				p.InFlight, p.Succeeded, p.QueueDepth, p.Host = in, s, q, host
				p.Labels = map[string]string{lab: host, "zone": lab}
				p.Utilisation = nil
				if opt {
					p.Utilisation = &u
				}
			})
		}
		if uA != uA || uB != uB || uA > 1e300 || uB > 1e300 || uA < -1e300 || uB < -1e300 {
			return // encoding/json refuses NaN and infinities
		}
		a := rec(inA, sA, uA, qA, labA, hostA, optA)
		b := rec(inB, sB, uB, qB, labB, hostB, optB)
		patched := checkPatch(t, a, b)
		if labA == labB && hostA == hostB && !patched && !strings.ContainsAny(labA, `"\`) {
			// Only dynamic members differ: the patch must take it, unless
			// a label key spells a dynamic member in another case.
			if !foldsToDynamic([]byte(labA)) && dynamicIndex([]byte(labA)) < 0 {
				t.Errorf("records differing only in counters not patched:\na: %s\nb: %s", a, b)
			}
		}
	})
}

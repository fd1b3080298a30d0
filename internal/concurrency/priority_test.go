package concurrency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/concurrency"
	"github.com/wardenhq/warden/pkg/spec"
)

// TestHigherPriorityServedFirst: a key's waiters are served by priority,
// and in arrival order within one; a high step queued behind low ones is
// next in line (it asks again soon) and takes the freed slot, across
// schedulers; Release names the waiters in the same order.
func TestHigherPriorityServedFirst(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	ls := setup(t, 2, concurrency.Config{Now: clk.Now})
	a, b := ls[0], ls[1]
	ctx := context.Background()
	if ok, _ := acquireAt(t, a, "k", 1, "j0.s", spec.PriorityLow); !ok {
		t.Fatal("the first holder was refused")
	}
	queue := []struct {
		holder string
		p      spec.Priority
	}{
		{"l1.s", spec.PriorityLow}, {"l2.s", spec.PriorityLow}, {"n1.s", spec.PriorityNormal},
		{"h1.s", spec.PriorityHigh}, {"l3.s", spec.PriorityLow}, {"h2.s", spec.PriorityHigh},
		{"c1.s", spec.PriorityCritical}, {"n2.s", ""}, // empty: normal
	}
	for i, w := range queue {
		clk.Add(time.Second)
		ok, retryAt := acquireAt(t, ls[i%2], "k", 1, w.holder, w.p)
		if ok {
			t.Fatalf("%s granted with limit 1", w.holder)
		}
		// h1, queued behind three, is next in line: it asks again soon
		// (when a holder's lease ends, or after RetryAfter), not only when
		// a Release names it.
		if want := clk.Now().Add(5 * time.Second); w.holder == "h1.s" && retryAt.After(want) {
			t.Fatalf("h1 asks again at %s, want by %s: it is next in line", retryAt, want)
		}
	}
	st, err := a.Inspect(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(st.Waiters), "[c1.s h1.s h2.s n1.s n2.s l1.s l2.s l3.s]"; got != want {
		t.Fatalf("waiters in the order %s, want %s (by priority, then arrival)", got, want)
	}
	clk.Add(time.Second)
	if ok, _ := acquireAt(t, b, "k", 1, "h3.s", spec.PriorityHigh); ok {
		t.Fatal("h3 granted with limit 1")
	}
	next, err := b.Release(ctx, "k", "j0.s")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(next) != "[c1.s]" {
		t.Fatalf("release hands the slot to %v, want the critical waiter c1.s", next)
	}
	for _, w := range []struct {
		holder string
		p      spec.Priority
	}{{"l1.s", spec.PriorityLow}, {"h1.s", spec.PriorityHigh}, {"h9.s", spec.PriorityHigh}} {
		if ok, _ := acquireAt(t, a, "k", 1, w.holder, w.p); ok {
			t.Fatalf("%s took the slot that is c1's", w.holder)
		}
	}
	if ok, _ := acquireAt(t, a, "k", 1, "c1.s", spec.PriorityCritical); !ok {
		t.Fatal("the critical waiter was refused the free slot")
	}
	// Limit 2 now: the freed slots go to the next two in order.
	if ok, _ := acquireAt(t, b, "k", 2, "h1.s", spec.PriorityHigh); !ok {
		t.Fatal("h1 refused the second slot")
	}
	if next, err := a.Release(ctx, "k", "c1.s"); err != nil || fmt.Sprint(next) != "[h2.s]" {
		t.Fatalf("release hands the slot to %v (%v), want [h2.s]", next, err)
	}
	if next, err := a.Release(ctx, "k", "h1.s"); err != nil || fmt.Sprint(next) != "[h2.s h3.s]" {
		t.Fatalf("release hands the slots to %v (%v), want [h2.s h3.s]", next, err)
	}
}

// oldEntry and oldRecord are a key's record as a version that did not know
// priorities reads and writes it.
type oldEntry struct {
	ID    string    `json:"id"`
	Until time.Time `json:"until"`
	Since time.Time `json:"since,omitzero"`
}

type oldRecord struct {
	Limit   int        `json:"limit"`
	Holders []oldEntry `json:"holders,omitempty"`
	Waiters []oldEntry `json:"waiters,omitempty"`
}

// TestRecordsWithoutPriorities: a fleet mixing versions. A record written by
// a version that did not know priorities reads as normal priority, its
// waiters in its order; the record is written with its waiters in the
// order they are served, so that such a version serves them by priority;
// when it writes the record again (dropping the priorities, adding a
// newcomer last), nobody is lost or granted twice, and both versions name
// the same waiter next.
func TestRecordsWithoutPriorities(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	b := setupBucket(t, 2, concurrency.Config{Now: clk.Now}, 0)
	l := b.ls[0]
	ctx := context.Background()
	now := clk.Now()
	old := oldRecord{Limit: 1, Holders: []oldEntry{{ID: "j0.s", Until: now.Add(time.Minute)}}, Waiters: []oldEntry{
		{ID: "o1.s", Since: now.Add(-2 * time.Second), Until: now.Add(30 * time.Second)},
		{ID: "o2.s", Since: now.Add(-time.Second), Until: now.Add(30 * time.Second)},
	}}
	raw, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.kv.Create(ctx, "k", raw); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		holder string
		p      spec.Priority
	}{{"l1.s", spec.PriorityLow}, {"n1.s", spec.PriorityNormal}, {"h1.s", spec.PriorityHigh}} {
		clk.Add(time.Second)
		if ok, _ := acquireAt(t, l, "k", 1, w.holder, w.p); ok {
			t.Fatalf("%s granted beside j0 with limit 1", w.holder)
		}
	}
	if got, want := holders(t, l, "k"), "[j0.s] [h1.s o1.s o2.s n1.s l1.s]"; got != want {
		t.Fatalf("state %s, want %s: the old waiters are normal", got, want)
	}
	// As stored: in the order served, a priority only beside the waiters
	// that are not normal.
	e, err := b.kv.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	var stored struct {
		Waiters []map[string]any `json:"waiters"`
	}
	if err := json.Unmarshal(e.Value(), &stored); err != nil {
		t.Fatal(err)
	}
	var layout []string
	for _, w := range stored.Waiters {
		layout = append(layout, fmt.Sprint(w["id"], "/", w["priority"]))
	}
	if got, want := fmt.Sprint(layout), "[h1.s/high o1.s/<nil> o2.s/<nil> n1.s/<nil> l1.s/low]"; got != want {
		t.Fatalf("stored waiters %s, want %s", got, want)
	}
	// The old version queues v1 (at the end) and writes the record back
	// without the priorities.
	var rec oldRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	rec.Waiters = append(rec.Waiters, oldEntry{ID: "v1.s", Since: clk.Now(), Until: clk.Now().Add(30 * time.Second)})
	if raw, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	if _, err := b.kv.Update(ctx, "k", raw, e.Revision()); err != nil {
		t.Fatal(err)
	}
	// The old version would hand the freed slot to the first waiter
	// written, h1: so does this one (not o1, who asked first).
	if next := release(t, b.ls[1], "k", "j0.s"); fmt.Sprint(next) != "[h1.s]" {
		t.Fatalf("release hands the slot to %v, want [h1.s] as the old version would", next)
	}
	for _, h := range []string{"o1.s", "v1.s"} {
		if ok, _ := acquireAt(t, l, "k", 1, h, spec.PriorityNormal); ok {
			t.Fatalf("%s took h1's slot", h)
		}
	}
	if ok, _ := acquireAt(t, b.ls[1], "k", 1, "h1.s", spec.PriorityHigh); !ok {
		t.Fatal("h1 refused the slot it was handed")
	}
	// l1 asks again at its priority: it goes back behind the normal ones.
	if ok, _ := acquireAt(t, l, "k", 1, "l1.s", spec.PriorityLow); ok {
		t.Fatal("l1 granted beside h1")
	}
	if got, want := holders(t, l, "k"), "[h1.s] [o1.s o2.s n1.s v1.s l1.s]"; got != want {
		t.Fatalf("state %s, want %s", got, want)
	}
}

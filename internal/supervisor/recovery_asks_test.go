package supervisor

import (
	"errors"
	"testing"
)

// The recovery's hand-out of due entries: one round of a job out at a
// time, entries that come due meanwhile after it (or back to the index
// when the round failed, so that recovery_retry is waited), one entry per
// key with its latest mark, and no more entries taken than recoveryHeld.
func TestAsksRoundsOfAJob(t *testing.T) {
	t.Parallel()
	due := func(job, key string, moved uint32) Due { return Due{Key: key, Job: job, Kind: kindStep, moved: moved} }
	for _, failed := range []bool{false, true} {
		a := newAsks()
		a.add([]Due{due("j", "step.j.a", 1), due("k", "step.k.a", 1), due("j", "step.j.b", 1), due("j", "step.j.a", 2)})
		if a.held != 3 || len(a.queue) != 2 {
			t.Fatalf("held %d in %d rounds, want 3 in 2", a.held, len(a.queue))
		}
		_, jr := a.head()
		if jr.job != "j" || len(jr.entries) != 2 || jr.entries[0].d.moved != 2 {
			t.Fatalf("first round %+v: want j's two entries, step.j.a with its latest mark", jr.entries)
		}
		a.handedOut()
		a.add([]Due{due("j", "step.j.c", 1)}) // j is out: after it
		if _, next := a.head(); next.job != "k" {
			t.Fatalf("next round %q, want k's", next.job)
		}
		if failed {
			jr.entries[0].err = errors.New("no scheduler answered")
		}
		handled, retry := a.finished(jr)
		if len(handled) != 2 {
			t.Fatalf("handled %d, want 2", len(handled))
		}
		switch {
		case failed && (len(retry) != 1 || retry[0].Key != "step.j.c" || len(a.queue) != 1):
			t.Fatalf("after a failed round: retry %+v, %d rounds queued; want step.j.c back to the index, k's round alone", retry, len(a.queue))
		case !failed && (retry != nil || len(a.queue) != 2 || a.queue[1].entries[0].d.Key != "step.j.c"):
			t.Fatalf("after a round: retry %+v, %d rounds queued; want step.j.c in a round after k's", retry, len(a.queue))
		}
		if want := 2; failed && a.held != 1 || !failed && a.held != want {
			t.Fatalf("held %d after the round (failed %v)", a.held, failed)
		}
	}
	a := newAsks()
	for i := range recoveryHeld {
		a.add([]Due{due("j", "step.j."+string(rune('a'+i%26))+string(rune('a'+i/26%26))+string(rune('a'+i/676)), 1)})
	}
	if a.room() != 0 {
		t.Fatalf("room %d after %d entries taken", a.room(), recoveryHeld)
	}
}

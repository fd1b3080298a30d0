package supervisor

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/protocol"
)

func rec(key, state string, written, locked time.Time) Record {
	return Record{Key: key, State: state, Written: written, LockedUntil: locked}
}

func TestIndexOrdersByDueAndForgetsFinishedRecords(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(10_000, 0)
	x := NewIndex(30 * time.Second)
	x.Observe(rec("job.j", "running", t0, time.Time{}))
	x.Observe(rec("step.j.late", "dispatched", t0, t0.Add(time.Minute)))
	x.Observe(rec("step.j.soon", "dispatched", t0, t0.Add(time.Second)))
	x.Observe(rec("step.j.pend", "pending", t0, time.Time{}))
	if next, _ := x.Next(); !next.Equal(t0.Add(time.Second)) {
		t.Fatalf("next due %v", next)
	}
	due := x.PopDue(t0.Add(31 * time.Second))
	if len(due) != 2 || due[0].Step != "soon" || !due[0].Locked || due[1].Step != "pend" || due[1].Locked {
		t.Fatalf("due %+v", due)
	}
	// Every step succeeds: what is left of the job is a check after the
	// grace, since it is unfinished and none of its steps is.
	x.Observe(rec("step.j.soon", "succeeded", t0.Add(2*time.Second), time.Time{}))
	x.Observe(rec("step.j.pend", "succeeded", t0.Add(3*time.Second), time.Time{}))
	x.Observe(rec("step.j.late", "succeeded", t0.Add(4*time.Second), time.Time{}))
	if x.Len() != 1 || x.Size() != 1 {
		t.Fatalf("%d scheduled, %d held; want the job check only", x.Len(), x.Size())
	}
	due = x.PopDue(t0.Add(time.Hour))
	if len(due) != 1 || due[0].Kind != kindJob || due[0].Locked {
		t.Fatalf("job check %+v", due)
	}
	if want := t0.Add(34 * time.Second); due[0].Key != "job.j" {
		t.Fatalf("job check %+v, want job.j at %v", due, want)
	}
	// The job finishes: the index forgets it.
	x.Observe(rec("job.j", "succeeded", t0.Add(5*time.Second), time.Time{}))
	if x.Len() != 0 || x.Size() != 0 {
		t.Fatalf("index kept %d scheduled, %d records", x.Len(), x.Size())
	}
}

func TestIndexReschedulesRenewedLease(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(10_000, 0)
	x := NewIndex(time.Second)
	x.Observe(rec("step.j.s", "dispatched", t0, t0.Add(time.Second)))
	x.Observe(rec("step.j.s", "dispatched", t0, t0.Add(time.Hour)))
	if got := x.PopDue(t0.Add(time.Minute)); len(got) != 0 {
		t.Fatalf("renewed lease came due: %+v", got)
	}
	if x.Len() != 1 {
		t.Fatalf("len %d", x.Len())
	}
}

// A small job keeps its steps inline in job.<id>; its Warden-Locked-Until
// header is the earliest lease of its dispatched steps.
func TestIndexInlineJobDueAtItsEarliestLease(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(10_000, 0)
	x := NewIndex(30 * time.Second)
	x.Observe(rec("job.small", "running", t0, t0.Add(5*time.Second)))
	if got := x.PopDue(t0.Add(4 * time.Second)); len(got) != 0 {
		t.Fatalf("due before its lease: %+v", got)
	}
	due := x.PopDue(t0.Add(5 * time.Second))
	if len(due) != 1 || due[0].Kind != kindJob || !due[0].Locked || due[0].Job != "small" {
		t.Fatalf("due %+v", due)
	}
	// Its step is released (a write without a lease): a check after the
	// grace unless a scheduler moves it first.
	x.Observe(rec("job.small", "running", t0.Add(6*time.Second), time.Time{}))
	due = x.PopDue(t0.Add(36 * time.Second))
	if len(due) != 1 || due[0].Locked {
		t.Fatalf("due %+v", due)
	}
}

// A step that ends while a dependent is still pending must bring the job
// back if nobody moves it on: found by the chaos suite (seed 572240), where
// a step parked as poison during a failover left its dependent pending and
// its job running forever. The pending dependent comes due itself.
func TestIndexPendingStepComesDueAfterAnotherEnds(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(10_000, 0)
	x := NewIndex(30 * time.Second)
	x.Observe(rec("job.j", "running", t0, time.Time{}))
	x.Observe(rec("step.j.bad", "dispatched", t0, t0.Add(time.Hour)))
	x.Observe(rec("step.j.after", "pending", t0, time.Time{}))
	for _, d := range x.PopDue(t0.Add(31 * time.Second)) {
		x.Recheck(d, t0.Add(31*time.Second)) // asked; nothing moved
	}
	x.Observe(rec("step.j.bad", "dead_lettered", t0.Add(time.Minute), time.Time{}))
	due := x.PopDue(t0.Add(2 * time.Minute))
	if len(due) != 1 || due[0].Step != "after" || due[0].Job != "j" {
		t.Fatalf("the pending dependent did not come due: %+v", due)
	}
}

// A job asked to advance again and again without moving is asked less and
// less often: first after the grace, then grace/8 after the first answer
// (which may come from a scheduler that parks the job in its memory and
// dies), doubling with every answer, at most 16 × the grace.
func TestIndexBacksOffRequestsThatMoveNothing(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(10_000, 0)
	x := NewIndex(8 * time.Second)
	x.Observe(rec("step.j.s", "pending", t0, time.Time{}))
	now := t0
	var gaps []time.Duration
	for range 11 {
		next, _ := x.Next()
		gaps = append(gaps, next.Sub(now))
		now = next
		for _, d := range x.PopDue(now) {
			x.Recheck(d, now)
		}
	}
	want := []time.Duration{8, 1, 2, 4, 8, 16, 32, 64, 128, 128, 128}
	for i := range want {
		want[i] *= time.Second
	}
	if !slices.Equal(gaps, want) {
		t.Fatalf("gaps %v, want %v", gaps, want)
	}
	// A write that leaves the step pending without a lease (a scheduler
	// noting why it waits) is no move: the backoff stands.
	x.Observe(rec("step.j.s", "pending", now, time.Time{}))
	if next, _ := x.Next(); next.Sub(now) != 128*time.Second {
		t.Fatalf("after a pending write: due in %v", next.Sub(now))
	}
	// A dispatch is a move; so is its release: the grace again.
	x.Observe(rec("step.j.s", "dispatched", now, now.Add(time.Hour)))
	x.Observe(rec("step.j.s", "pending", now, time.Time{}))
	if next, _ := x.Next(); next.Sub(now) != 8*time.Second {
		t.Fatalf("after a dispatch and a release: due in %v", next.Sub(now))
	}
}

// The chaos suite's partitions (seeds 4242, 31337): a scheduler answered
// the advance request about a job whose first step had waited out the
// grace, wrote why the step still waited (every agent busy) and was
// killed. Its write reset the entry, and the next request came a whole
// grace later (or twice the grace, when the reason had not changed and
// nothing was written). The recheck after an answer stands through such a
// write; an inline job's record (its one step inside) the same.
func TestIndexRecheckAfterAnAnswerOutlivesAWaitingReason(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(10_000, 0)
	const grace = 8 * time.Second
	for _, key := range []string{"step.j.s", "job.small"} {
		x := NewIndex(grace)
		x.Observe(rec(key, "pending", t0, time.Time{}))
		asked := t0.Add(grace)
		due := x.PopDue(asked)
		if len(due) != 1 || due[0].Key != key {
			t.Fatalf("%s: due %+v", key, due)
		}
		x.Recheck(due[0], asked)
		// The answering scheduler's write of the step's waiting reason.
		x.Observe(rec(key, "pending", asked.Add(time.Millisecond), time.Time{}))
		next, _ := x.Next()
		if want := asked.Add(time.Millisecond + grace/8); !next.Equal(want) {
			t.Fatalf("%s: next request at +%v after the answer, want +%v", key, next.Sub(asked), want.Sub(asked))
		}
	}
}

func TestIndexIgnoresForeignKeysAndForgetsDeleted(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(10_000, 0)
	x := NewIndex(time.Second)
	x.Observe(rec("idem.abc", "pending", t0, time.Time{}))
	x.Observe(rec("step.j", "pending", t0, time.Time{}))
	x.Observe(rec("step.j.s.t", "pending", t0, time.Time{}))
	if x.Size() != 0 {
		t.Fatalf("%d records held from foreign keys", x.Size())
	}
	x.Observe(rec("step.j.s", "dispatched", t0, t0.Add(time.Second)))
	x.Observe(Record{Key: "step.j.s", Deleted: true, Written: t0})
	if x.Size() != 0 || x.Len() != 0 {
		t.Fatalf("deleted record kept: %d held, %d scheduled", x.Size(), x.Len())
	}
}

// Issue 14: supervisor memory with 1,000,000 queued steps stays under
// 1 GiB. The index holds one entry per record, in one map and one heap of
// pointers to the same entries. Measured on 250,000 queued steps, each of
// its own job (two records each, the worst case) and projected linearly
// (the map and heap grow linearly) to a million, to spare the shared CPU.
func TestIndexMemoryForAMillionQueuedSteps(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates half a million entries")
	}
	const n, target = 250_000, 1_000_000
	t0 := time.Unix(10_000, 0)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	x := NewIndex(30 * time.Second)
	for i := range n {
		// The key as the follower has it: a fresh string per write.
		k := fmt.Sprintf("step.job-%07d.s", i)
		x.Observe(Record{Key: k, State: "dispatched", Written: t0, LockedUntil: t0.Add(time.Duration(i) * time.Millisecond)})
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	used := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	projected := used * target / n
	t.Logf("%d queued steps (and %d jobs): index heap %.1f MiB, %d bytes per record; %d queued steps: %.0f MiB",
		n, n, float64(used)/(1<<20), used/int64(2*n), target, float64(projected)/(1<<20))
	if x.Size() != 2*n || x.Len() != n {
		t.Fatalf("held %d, scheduled %d", x.Size(), x.Len())
	}
	if projected >= 1<<30 {
		t.Fatalf("index would use %d bytes for %d queued steps", projected, target)
	}
	runtime.KeepAlive(x)
}

// The recovery handles a due entry while the index goes on observing
// writes, so an outcome can arrive after a write of its record. A move (a
// dispatch: the lease now says when it is due) wins over the outcome; a
// write that is no move (the waiting reason of the scheduler answering)
// does not, and the recheck after the answer still comes grace/8 later.
func TestIndexOutcomeAfterAWriteOfItsRecord(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(10_000, 0)
	const grace = 8 * time.Second
	asked := t0.Add(grace)
	lease := asked.Add(time.Minute)
	for _, c := range []struct {
		name  string
		write Record
		want  time.Time
	}{
		{"dispatched meanwhile", rec("step.j.s", "dispatched", asked.Add(time.Millisecond), lease), lease},
		{"waiting reason meanwhile", rec("step.j.s", "pending", asked.Add(time.Millisecond), time.Time{}), asked.Add(2*time.Millisecond + grace/8)},
	} {
		for _, outcome := range []string{"recheck", "retry"} {
			x := NewIndex(grace)
			x.Observe(rec("step.j.s", "pending", t0, time.Time{}))
			due := x.PopDue(asked)
			if len(due) != 1 {
				t.Fatalf("due %+v", due)
			}
			x.Observe(c.write)
			want := c.want
			if outcome == "recheck" {
				x.Recheck(due[0], asked.Add(2*time.Millisecond))
			} else {
				x.Retry(due[0], asked.Add(time.Second))
				if c.write.LockedUntil.IsZero() {
					want = asked.Add(time.Second) // no move: the retry stands
				}
			}
			if next, _ := x.Next(); !next.Equal(want) {
				t.Errorf("%s, then %s: next due at +%v after the ask, want +%v", c.name, outcome, next.Sub(asked), want.Sub(asked))
			}
		}
	}
}

// A job with a timeout is asked for at its deadline, even while its step
// records are watched instead of it (a scheduler's wake for it may have
// gone with the scheduler); a write after the deadline (its scheduler saw
// it) leaves the job to its records again.
func TestIndexAsksForAJobAtItsDeadline(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(10_000, 0)
	deadline := t0.Add(5 * time.Second)
	x := NewIndex(30 * time.Second)
	job := rec("job.j", "running", t0, time.Time{})
	job.Deadline = deadline
	x.Observe(job)
	x.Observe(rec("step.j.s", "dispatched", t0, t0.Add(time.Minute)))
	if next, _ := x.Next(); !next.Equal(deadline) {
		t.Fatalf("next due %v after t0, want the deadline (+5s)", next.Sub(t0))
	}
	due := x.PopDue(deadline)
	if len(due) != 1 || due[0].Key != "job.j" || due[0].Locked {
		t.Fatalf("due at the deadline: %+v", due)
	}
	// Its scheduler cancels a step after the deadline (the job record's
	// own write drops the header).
	x.Observe(rec("step.j.s", "dispatched", deadline.Add(time.Millisecond), t0.Add(time.Minute)))
	if next, _ := x.Next(); !next.Equal(t0.Add(time.Minute)) {
		t.Fatalf("after a write past the deadline, next due %v after t0, want the step's lease (+1m)", next.Sub(t0))
	}
}

// Asked at its deadline and answered, an inline job whose lease ends
// sooner than the recheck is looked at when the lease ends (a scheduler
// that ignores the timeout must not delay the lease's recovery).
func TestIndexRecheckKeepsTheLease(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(10_000, 0)
	deadline := t0.Add(5 * time.Second)
	lease := deadline.Add(time.Second)
	x := NewIndex(30 * time.Second)
	job := rec("job.j", "running", t0, lease)
	job.Deadline = deadline
	x.Observe(job)
	due := x.PopDue(deadline)
	if len(due) != 1 || due[0].Locked {
		t.Fatalf("due at the deadline: %+v", due)
	}
	x.Recheck(due[0], deadline)
	if next, _ := x.Next(); !next.Equal(lease) {
		t.Fatalf("next due %v after the deadline, want the lease's end (+1s)", next.Sub(deadline))
	}
}

// A recheck of an entry whose lease has already passed (nothing was
// released: the index's lease is not the record's) waits the backoff; it
// is not due again at once, which made a loop of reads and asks.
func TestIndexRecheckOfAPastLeaseWaitsTheBackoff(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(10_000, 0)
	x := NewIndex(8 * time.Second)
	x.Observe(rec("step.j.s", "dispatched", t0, t0.Add(time.Second)))
	now := t0.Add(2 * time.Second)
	due := x.PopDue(now)
	if len(due) != 1 || !due[0].Locked {
		t.Fatalf("due %+v", due)
	}
	x.Recheck(due[0], now)
	if next, _ := x.Next(); !next.Equal(now.Add(time.Second)) {
		t.Fatalf("next due %v after the recheck, want the backoff (grace/8 = 1s)", next.Sub(now))
	}
}

// A scheduler that answers an ask with not_found has no record of the
// job: a step record outlived it (a compensation's stray of an older
// version, a job record purged by hand). The entry is asked about again
// on the answered ask's backoff, as any answered one is; retried after
// recovery_retry (1 s), it was asked about every second for ever.
func TestRecoveryAsksAboutAJobNoSchedulerKnowsOnTheBackoff(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(10_000, 0)
	const grace = 30 * time.Second
	x := NewIndex(grace)
	x.Observe(rec("step.gone.s", "pending", t0, time.Time{}))
	due := x.PopDue(t0.Add(grace))
	if len(due) != 1 {
		t.Fatalf("due at the grace: %+v", due)
	}
	r := &recovery{retry: time.Second, log: zerolog.Nop(), term: &term{now: func() time.Time { return t0.Add(grace) }}}
	notFound := fmt.Errorf("%w: job gone: scheduler answered: %w", ErrAdvanceFailed,
		protocol.NewReplyError(protocol.CodeNotFound, "unknown job"))
	r.settle(x, []outcome{{d: due[0], err: notFound}})
	next, ok := x.Next()
	if want := t0.Add(grace + grace/recheckDivisor); !ok || !next.Equal(want) {
		t.Fatalf("asked about again at %v (scheduled %v), want %v: the answered ask's backoff", next.Sub(t0), ok, want.Sub(t0))
	}
}

package presence

import (
	"math"
	"testing"
	"time"
)

// fakeCPU is a process whose CPU time the test advances.
type fakeCPU struct {
	cpu   time.Duration
	reads int
}

func (f *fakeCPU) read() (time.Duration, bool) {
	f.reads++
	return f.cpu, true
}

func TestUsageIsOneReadingForManyCallers(t *testing.T) {
	t.Parallel()
	f := &fakeCPU{}
	u := &Usage{read: f.read, cpus: 2}
	t0 := time.Unix(1_700_000_000, 0)
	if got := u.Sample(t0); got != nil {
		t.Fatalf("first call, no interval yet: %v", *got)
	}
	f.cpu += time.Second // one of two cores busy for the next second
	first := u.Sample(t0.Add(time.Second))
	if first == nil || math.Abs(*first-0.5) > 1e-9 {
		t.Fatalf("after one second at one core of two: %v, want 0.5", first)
	}
	reads := f.reads
	// 5,000 agents of one process beating within the same quarter second
	// share that reading.
	for i := range 5000 {
		got := u.Sample(t0.Add(time.Second + time.Duration(i)*time.Microsecond*40))
		if got == nil || *got != *first {
			t.Fatalf("call %d within %s of the reading: %v, want %v", i, usageMinPeriod, got, *first)
		}
	}
	if f.reads != reads {
		t.Fatalf("%d more CPU readings for calls within %s of one", f.reads-reads, usageMinPeriod)
	}
}

func TestUsageSmoothsBursts(t *testing.T) {
	t.Parallel()
	f := &fakeCPU{}
	u := &Usage{read: f.read, cpus: 1}
	at := time.Unix(1_700_000_000, 0)
	step := func(busy float64) float64 {
		at = at.Add(time.Second)
		f.cpu += time.Duration(busy * float64(time.Second))
		v := u.Sample(at)
		if v == nil {
			t.Fatal("no value after an interval")
		}
		return *v
	}
	u.Sample(at)
	for range 30 {
		step(0.2) // steady at 20 %
	}
	// A one-second burst to 100 % moves the value by 1 - e^(-1/5) of the
	// 80 points (14.5), not by all of them.
	v := step(1)
	if want := 0.2 + 0.8*(1-math.Exp(-0.2)); math.Abs(v-want) > 0.01 {
		t.Fatalf("one busy second moved 20 %% to %.3f, want about %.3f", v, want)
	}
	for range 30 {
		v = step(0.2)
	}
	if math.Abs(v-0.2) > 0.01 {
		t.Fatalf("back at 20 %% for 30 s: %.3f", v)
	}
	// A lasting change is followed: 63 % of the way after UsageSmoothing,
	// nearly all of it after three times that.
	n := int(UsageSmoothing / time.Second)
	for range n {
		v = step(0.9)
	}
	if want := 0.2 + 0.7*(1-math.Exp(-1)); math.Abs(v-want) > 0.02 {
		t.Fatalf("after %s at 90 %%: %.3f, want about %.3f", UsageSmoothing, v, want)
	}
	for range 2 * n {
		v = step(0.9)
	}
	if v < 0.2+0.7*0.95-0.01 {
		t.Fatalf("after %s at 90 %%: %.3f", 3*UsageSmoothing, v)
	}
}

func TestUsageUnreadable(t *testing.T) {
	t.Parallel()
	u := &Usage{read: func() (time.Duration, bool) { return 0, false }}
	now := time.Unix(1_700_000_000, 0)
	for i := range 3 {
		if got := u.Sample(now.Add(time.Duration(i) * time.Second)); got != nil {
			t.Fatalf("CPU time unreadable, yet %v reported", *got)
		}
	}
}

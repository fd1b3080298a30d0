package presence

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// Usage samples the resource utilisation an agent reports in its presence
// (protocol.Presence.Utilisation): the busier of CPU and memory, 0..1.
//
// CPU is the process's user+system time, plus that of its finished child
// processes (shell actions), divided by the CPUs the process may use,
// smoothed over about UsageSmoothing so that a burst of a second or two
// does not move it. Memory counts only under a Go memory limit
// (GOMEMLIMIT / debug.SetMemoryLimit): the runtime's total memory over that
// limit. The zero value is ready to use; safe for concurrent use.
//
// Every Announcer of a process reads the one processUsage: the agents of a
// process share its CPU, so one reading serves them all. Each sampling its
// own, over its own second, 5,000 agents in one process (the bench's
// fleet) reported a new value in half of their heartbeats, and every
// reader decoded each of those records in full (docs/performance.md,
// session 11).
type Usage struct {
	mu    sync.Mutex
	at    time.Time     // when CPU time was last read
	cpu   time.Duration // CPU time read then
	value float64       // the smoothed CPU utilisation
	mem   float64       // memory use at the last reading
	have  bool          // value holds at least one interval
	seen  bool          // at and cpu hold a reading

	// read and cpus replace cpuTime and runtime.NumCPU in tests.
	read func() (time.Duration, bool)
	cpus int
}

// processUsage is what every Announcer in this process reports.
var processUsage Usage

// UsageSmoothing is the time constant of the smoothing: after a step change
// in CPU use, the reported utilisation has moved 63 % of the way after this
// long, 95 % after three times it.
const UsageSmoothing = 5 * time.Second

// usageMinPeriod is the shortest interval CPU time is read over: calls in
// between return the current value without a system call.
const usageMinPeriod = 250 * time.Millisecond

// Sample returns the smoothed utilisation as of now; nil until a first
// interval has passed, or where CPU time cannot be read.
func (u *Usage) Sample(now time.Time) *float64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.seen && now.Sub(u.at) < usageMinPeriod {
		return u.current()
	}
	read := u.read
	if read == nil {
		read = cpuTime
	}
	cpu, ok := read()
	if !ok {
		return nil
	}
	prevAt, prevCPU, seen := u.at, u.cpu, u.seen
	u.at, u.cpu, u.seen = now, cpu, true
	u.mem = memoryUse()
	if !seen || !now.After(prevAt) {
		return u.current()
	}
	cpus := u.cpus
	if cpus <= 0 {
		cpus = runtime.NumCPU()
	}
	dt := now.Sub(prevAt)
	v := float64(cpu-prevCPU) / float64(dt) / float64(cpus)
	v = min(max(v, 0), 1)
	if !u.have {
		u.value, u.have = v, true
	} else {
		// Exponential smoothing with a weight for the interval's length,
		// so that uneven intervals weigh what they cover.
		w := 1 - math.Exp(-float64(dt)/float64(UsageSmoothing))
		u.value += w * (v - u.value)
	}
	return u.current()
}

// current is the value to report: the smoothed CPU use, or the memory use
// when that is higher. Callers hold u.mu.
func (u *Usage) current() *float64 {
	if !u.have {
		return nil
	}
	v := min(max(u.value, u.mem, 0), 1)
	return &v
}

// memoryUse is the runtime's memory over the Go memory limit, 0 without one.
func memoryUse() float64 {
	limit := debug.SetMemoryLimit(-1)
	if limit <= 0 || limit == math.MaxInt64 {
		return 0
	}
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return float64(s[0].Value.Uint64()) / float64(limit)
}

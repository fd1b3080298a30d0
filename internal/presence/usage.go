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
// processes (shell actions), over the time since the previous sample,
// divided by the CPUs the process may use. Memory counts only under a Go
// memory limit (GOMEMLIMIT / debug.SetMemoryLimit): the runtime's total
// memory over that limit. The zero value is ready to use; safe for
// concurrent use.
type Usage struct {
	mu   sync.Mutex
	at   time.Time
	cpu  time.Duration
	seen bool
}

// Sample returns the utilisation since the previous call; nil on the
// first call, or where CPU time cannot be read.
func (u *Usage) Sample(now time.Time) *float64 {
	cpu, ok := cpuTime()
	if !ok {
		return nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	prevAt, prevCPU, seen := u.at, u.cpu, u.seen
	u.at, u.cpu, u.seen = now, cpu, true
	if !seen || !now.After(prevAt) {
		return nil
	}
	v := float64(cpu-prevCPU) / float64(now.Sub(prevAt)) / float64(runtime.NumCPU())
	v = max(v, memoryUse())
	v = min(max(v, 0), 1)
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

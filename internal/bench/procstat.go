package bench

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, 100 on every Linux this runs on.
const clockTicks = 100

// cpuTime reads a process's user+system CPU time from /proc.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may contain spaces; fields start after ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	// f[0] is the state (field 3): utime is field 14, stime 15.
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// memStatus returns VmRSS and VmHWM (peak RSS) in bytes.
func memStatus(pid int) (rss, hwm uint64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		for _, k := range []string{"VmRSS:", "VmHWM:"} {
			if strings.HasPrefix(line, k) {
				fs := strings.Fields(line)
				if len(fs) >= 2 {
					v, _ := strconv.ParseUint(fs[1], 10, 64)
					if k == "VmRSS:" {
						rss = v * 1024
					} else {
						hwm = v * 1024
					}
				}
			}
		}
	}
	return rss, hwm, sc.Err()
}

// cpuMeter measures the CPU cores a set of processes used over a window.
type cpuMeter struct {
	pids  map[string]int
	start map[string]time.Duration
	at    time.Time
}

func newCPUMeter(pids map[string]int) *cpuMeter {
	m := &cpuMeter{pids: pids, start: map[string]time.Duration{}, at: time.Now()}
	for name, pid := range pids {
		m.start[name], _ = cpuTime(pid)
	}
	return m
}

// Cores returns, per process, CPU seconds used per wall second since start.
func (m *cpuMeter) Cores() map[string]float64 {
	wall := time.Since(m.at).Seconds()
	out := map[string]float64{}
	for name, pid := range m.pids {
		t, err := cpuTime(pid)
		if err != nil {
			continue
		}
		out[name] = (t - m.start[name]).Seconds() / wall
	}
	return out
}

// loadAvg is the 1-minute load average, to record how busy the machine was.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// machineMeter measures how busy the whole machine was (every process,
// everyone's), from /proc/stat.
type machineMeter struct{ busy, total uint64 }

func newMachineMeter() *machineMeter {
	b, t := machineTicks()
	return &machineMeter{busy: b, total: t}
}

// Busy is the fraction of all cores' time spent not idle since the start.
func (m *machineMeter) Busy() float64 {
	b, t := machineTicks()
	if t <= m.total {
		return 0
	}
	return float64(b-m.busy) / float64(t-m.total)
}

func machineTicks() (busy, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0
	}
	for i, v := range f[1:] {
		n, _ := strconv.ParseUint(v, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}
